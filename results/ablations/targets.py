"""Check the ablation grid's targets against a folder's ``ablations.csv`` and write them into its ``targets.md``.

The grid's experiments are named ``ablate_<task>_<arm>`` (``configs/experiment/ablate_*.yaml``), and the
targets compare its arms, the runs' seeds pooled (:func:`hybrid.report.seeds.group_seeds`), for every task that
has them:

- the all-LSTM decoder (``lstm``) within 10% (relative) of the all-attention decoder's error rate
  (``attention``) at the same budget;
- the parameter-matched all-LSTM decoder (``param_matched``) within 5% of all-attention;
- the equal-width all-LSTM decoder no worse than the parameter-matched one (more capacity should not lose);
- convert-then-fine-tune (``convert``) reaching 95% of the transformer's exact match with at most 20% of its
  training steps.

Each target is judged on the means; ``significant`` says whether the two configurations' difference stands out
of the spread between seeds (:func:`hybrid.report.seeds.significant`), and ``measured`` says it in words. Arms
trained alike but for the grid's defaults share a suffix (``ablate_g2p_lstm_lr_1.5e-3`` against
``ablate_g2p_attention_lr_1.5e-3``), and each suffix is judged on its own, its name in brackets.

    python results/ablations/targets.py results/ablations-converged   (run.sh runs it after hybrid ablate)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybrid.files import write_atomically
from hybrid.report.files import read_results
from hybrid.report.seeds import SIGNIFICANCE, group_seeds, significant
from hybrid.report.tables import cell, error_of

ARMS = ("lstm", "attention", "param_matched", "convert")
VERDICTS = {True: "met", False: "MISSED", None: "not measurable"}  # None: the baseline scored 0


def compare_errors(task: str, target: str, mine: dict[str, Any], theirs: dict[str, Any], needed: str,
                   within: float | None) -> dict[str, Any] | None:
    """A target on two configurations' error rates: ``mine`` at most ``within`` (relative) above ``theirs``;
    ``within=None`` asks only that ``mine`` be no worse, which a difference inside the spread between seeds
    also satisfies. None where either has no error rate."""
    if not (error_of(mine) and error_of(theirs)):
        return None
    (metric, ours), (_, reference) = error_of(mine), error_of(theirs)
    excess = ours / reference - 1.0 if reference > 0 else float("inf") if ours > 0 else 0.0
    verdict = significant(mine, theirs, metric)
    met = excess <= within if within is not None else excess <= 0.0 or verdict is False
    return {"task": task, "target": target.format(metric=metric), "needed": needed,
            "measured": f"{cell(metric, mine)} vs {cell(metric, theirs)} ({excess:+.1%}, {SIGNIFICANCE[verdict]})",
            "met": met, "significant": verdict}


def grid_checks(task: str, lstm: dict | None, attention: dict | None, matched: dict | None,
                converted: dict | None) -> list[dict[str, Any]]:
    """The targets among one suffix's arms (any of them may be missing: its targets are then left out)."""
    out = []
    comparisons = [(lstm, attention, "all-LSTM {metric} within 10% of all-attention's", "<= +10%", 0.10),
                   (matched, attention, "parameter-matched all-LSTM {metric} within 5% of all-attention's",
                    "<= +5%", 0.05),
                   (lstm, matched, "equal-width all-LSTM {metric} no worse than the parameter-matched one",
                    "<= +0%, or inside the seeds' spread", None)]
    for mine, theirs, target, needed, within in comparisons:
        if mine and theirs and (check := compare_errors(task, target, mine, theirs, needed, within)):
            out.append(check)
    if converted and attention and attention.get("test/exact_match") is not None:
        theirs, share = attention["test/exact_match"], converted["steps"] / attention["steps"]
        reached = converted["test/exact_match"] / theirs if theirs > 0 else None  # nothing to reach
        verdict = significant(converted, attention, "test/exact_match")
        out.append({"task": task, "target": "convert-then-fine-tune exact match vs the transformer's",
                    "needed": ">= 95% with <= 20% of its steps",
                    "measured": f"{cell('test/exact_match', converted)} vs {cell('test/exact_match', attention)} "
                                f"({'n/a' if reached is None else f'{reached:.1%}'}, {SIGNIFICANCE[verdict]}) "
                                f"with {share:.0%} of its steps",
                    "met": None if reached is None else reached >= 0.95 and share <= 0.20,
                    "significant": verdict})
    return out


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every target of every task and suffix that ``rows`` (runs, or configurations) have the arms of, the
    grid's own arms (no suffix) first; each a dict of task, target, needed, measured, met and significant."""
    by_run = {row["run"]: row for row in group_seeds(rows)}
    out = []
    for task in sorted({row["task"] for row in by_run.values()}):
        suffixes = sorted({run[len(f"ablate_{task}_{arm}"):] for run in by_run for arm in ARMS
                           if run.startswith(f"ablate_{task}_{arm}")}, key=lambda suffix: (suffix != "", suffix))
        for suffix in suffixes:
            arms = (by_run.get(f"ablate_{task}_{arm}{suffix}") for arm in ARMS)
            variant = f" [{suffix.lstrip('_')}]" if suffix else ""
            out.extend({**check, "target": check["target"] + variant} for check in grid_checks(task, *arms))
    return out


def targets_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The targets as Markdown, one line each: task, target, what it needs, what was measured, the verdict."""
    lines = [f"- {check['task']}: {check['target']} ({check['needed']}): {check['measured']}, "
             f"{VERDICTS[check['met']]}\n" for check in targets(rows)]
    return ("Targets, judged on the means of each configuration's seeds:\n\n" + "".join(lines)) if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder hybrid ablate wrote (its ablations.csv is read)")
    folder = parser.parse_args().folder
    text = targets_markdown(read_results(folder / "ablations.csv"))
    if not text:
        parser.error(f"{folder / 'ablations.csv'} has none of the grid's arms (ablate_<task>_lstm, _attention, ...)")
    write_atomically(folder / "targets.md", text)
    print(text, end="")


if __name__ == "__main__":
    main()
