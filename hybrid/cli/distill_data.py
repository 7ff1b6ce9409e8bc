"""``hybrid distill-data``: the training file of sequence-level knowledge distillation (Kim and Rush, 2016).

The teacher decodes every distinct source of a data module's training split through ``hybrid generate``'s
bulk job (:mod:`hybrid.bulk`: bucketed, refilled, resumable), with its own generation defaults unless
the command line sets an option, and each source is written with the teacher's output beside it: the file a
student then fits on (``data.train_path``) in place of the references, as fairseq's and Marian's users
distil (decode the training set with the teacher, train the student on that).
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from hybrid.cli.generate import decoder_fingerprint, load_bulk_job
from hybrid.files import write_atomically

logger = logging.getLogger(__name__)


def run_distill_data(cfg: DictConfig) -> Path:
    """Decode the distinct training sources of ``cfg.data`` with the teacher ``cfg.ckpt_path`` and write
    ``cfg.output`` atomically: one ``source<TAB>teacher output`` line per source, in the split's order (a
    ``.jsonl`` output holds ``{"source": ..., "target": ...}`` lines instead). A source longer than the
    teacher's ``max_positions`` cannot be decoded and is left out, counted. The bulk job works in
    ``<output>.parts``, so a killed run resumes from its finished shards; the folder goes once the file
    is written. Returns the output's path."""
    from hybrid.bulk import run_bulk

    output = Path(cfg.output)
    # "empty": a source the teacher cannot read keeps its line, so line i still answers source i, and
    # the rejects file names it; it is left out of the training file below.
    teacher, tokenizer, job = load_bulk_job(cfg, on_error="empty")
    if job.generation.num_return_sequences != 1:
        raise ValueError("sequence-level distillation trains on one teacher output per source: leave "
                         "num_return_sequences at 1 (num_beams=N searches N beams and keeps the best)")
    datamodule = instantiate(cfg.data, _convert_="all")
    sources = list(dict.fromkeys(source for source, _ in datamodule.pairs["train"]))  # a word with variants once
    work = Path(f"{output}.parts")
    work.mkdir(parents=True, exist_ok=True)
    # JSON lines, so that a source holding a tab or a line break stays one input of the bulk job.
    sources_file = write_atomically(work / "sources.jsonl", "".join(
        json.dumps({"source": source}, ensure_ascii=False) + "\n" for source in sources))
    outputs_file = work / "teacher.txt"
    run_bulk(teacher, tokenizer, str(sources_file), str(outputs_file), job, input_format="jsonl",
             work_dir=str(work / "shards"), resume=cfg.resume, progress=cfg.progress,
             fingerprint=decoder_fingerprint(cfg))
    outputs = outputs_file.read_bytes().decode("utf-8").split("\n")[:-1]  # bytes: a "\r" inside stays inside
    if len(outputs) != len(sources):
        raise ValueError(f"the teacher wrote {len(outputs)} lines for {len(sources)} sources: some output holds "
                         "a line break, which no training file can keep")
    rejected = _rejected(Path(f"{outputs_file}.rejects.tsv"))
    pairs = [(source, target) for number, (source, target) in enumerate(zip(sources, outputs, strict=True), start=1)
             if number not in rejected]
    if rejected:
        first = min(rejected)
        logger.warning("%d of %d training sources are left out, as the teacher cannot decode them; the first, "
                       "%r: %s", len(rejected), len(sources), sources[first - 1], rejected[first])
    if not pairs:
        raise ValueError(f"the teacher could decode none of the {len(sources)} training sources: "
                         f"{rejected[min(rejected)]}")
    as_jsonl = output.name.lower().endswith((".jsonl", ".json"))
    write_atomically(output, "".join(_training_line(source, target, as_jsonl) for source, target in pairs))
    shutil.rmtree(work)
    empty = sum(not target.strip() for _, target in pairs)
    if empty:
        logger.warning("%d of the teacher's outputs are empty: hybrid fit skips those lines (empty_text)", empty)
    logger.info("wrote %d training pairs (source, teacher output) to %s", len(pairs), output)
    logger.info("train a student on them, with this data's validation and test references: %s",
                _fit_command(cfg, output))
    return output


def _rejected(path: Path) -> dict[int, str]:
    """The bulk job's rejects file as {1-based input line: why}; empty when it wrote none."""
    if not path.exists():
        return {}
    lines = (line.split("\t", 1) for line in path.read_text(encoding="utf-8").splitlines())
    return {int(number): reason for number, reason in lines}


def _training_line(source: str, target: str, as_jsonl: bool) -> str:
    """One line of the training file, as ``hybrid.records.read_parallel_file`` reads it."""
    if as_jsonl:
        return json.dumps({"source": source, "target": target}, ensure_ascii=False) + "\n"
    if any(separator in text for text in (source, target) for separator in "\t\r\n"):
        raise ValueError(f"the pair {source!r} -> {target!r} holds a tab or a line break, which a TSV line cannot "
                         "keep: name the output .jsonl")
    return f"{source}\t{target}\n"


def _fit_command(cfg: DictConfig, output: Path) -> str:
    """The ``hybrid fit`` command line that trains on ``output``: this command line's data options and seed,
    so that the held-out splits are the same, with ``output`` as the training file."""
    hydra = HydraConfig.get()
    data = hydra.runtime.choices.get("data")
    same_data = [override for override in hydra.overrides.task
                 if override.startswith(("data.", "seed=")) and not override.startswith("data.train_path=")]
    command = shlex.join(["hybrid", "fit", f"data={data}", *same_data, f"data.train_path={output}",
                          "init_from=STUDENT.ckpt"])
    if data != "g2p" and (cfg.data.get("val_path") is None or cfg.data.get("test_path") is None):
        command += " data.val_path=VAL.tsv data.test_path=TEST.tsv (the held-out pairs, else they are cut from the "
        command += "teacher's outputs)"
    return command
