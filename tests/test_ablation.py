"""`hybrid ablate` on fake runs, seeds pooled and compared, its plot, the grid's targets (results/ablations/
targets.py), the training clock in a real run, and the ablation notebook on a tiny table."""

import csv
import json
import os
import runpy
import statistics
import sys
import time
from pathlib import Path

import pytest
from conftest import execute_notebook, tiny_model
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from hybrid.cli import main
from hybrid.cli.train import run_fit
from hybrid.report.files import read_results, write_results
from hybrid.report.plot import pareto_figure, pareto_front
from hybrid.report.runs import changed_options, write_validation_curves
from hybrid.report.seeds import group_seeds, significant
from hybrid.report.tables import conversions, markdown_table
from hybrid.tokenizer import Seq2SeqTokenizer
from hybrid.training.callbacks import CLOCK_FILE
from hybrid.training.checkpoint import write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
TARGETS_SCRIPT = ROOT / "results" / "ablations" / "targets.py"
TARGETS = runpy.run_path(str(TARGETS_SCRIPT))  # the grid's targets live with the results that check them
targets, targets_markdown = TARGETS["targets"], TARGETS["targets_markdown"]
ALPHABET = "abcdefghi"  # 4 specials + 9 letters: the tiny models' 13-token vocabulary


def fake_run(folder: Path, name: str, mixers: list[str], metrics: dict[str, float], task: str = "copy",
             seed: int = 0, train_time_s: float = 12.5) -> Path:
    """A folder shaped like a `hybrid fit` run: composed config, last.ckpt, metrics.csv, training clock."""
    tokenizer = Seq2SeqTokenizer.train([ALPHABET], [ALPHABET], "char", "char")
    model = tiny_model(mixers, seed=len(name))
    assert tokenizer.vocab_size == model.config.vocab_size
    write_checkpoint(model, tokenizer, folder / "checkpoints" / "last.ckpt")
    data = ({"_target_": "hybrid.training.G2PDataModule"} if task == "g2p"
            else {"_target_": "hybrid.training.SyntheticDataModule", "task": task})
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"name": name, "seed": seed, "data": data}), folder / ".hydra" / "config.yaml")
    (folder / "csv").mkdir()
    with open(folder / "csv" / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["epoch", "step", "val/loss", *metrics])
        writer.writeheader()
        writer.writerow({"epoch": 0, "step": 10, "val/loss": 1.0})
        writer.writerow({"epoch": 0, "step": 10, **metrics})
    (folder / CLOCK_FILE).write_text(json.dumps({"train_time_s": train_time_s, "train_tokens_per_s": 1000.0}))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    fake_run(root / "a" / "0_ablate_copy_attention", "ablate_copy_attention", ["attention"] * 2,
             {"test/cer": 0.10, "test/exact_match": 0.80})
    fake_run(root / "a" / "1_ablate_copy_lstm", "ablate_copy_lstm", ["lstm"] * 2,
             {"test/cer": 0.105, "test/exact_match": 0.70})
    fake_run(root / "a" / "2_ablate_copy_lstm_old", "ablate_copy_lstm", ["lstm"] * 3, {"test/cer": 0.9})
    os.utime(root / "a" / "2_ablate_copy_lstm_old" / "checkpoints" / "last.ckpt", (time.time() - 60,) * 2)
    for seed, cer, seconds in [(1, 0.115, 14.5), (2, 0.125, 16.5)]:  # two more seeds of ablate_copy_lstm
        fake_run(root / "a" / f"1_ablate_copy_lstm_seed{seed}", "ablate_copy_lstm", ["lstm"] * 2,
                 {"test/cer": cer, "test/exact_match": 0.70}, seed=seed, train_time_s=seconds)
    fake_run(root / "b", "ablate_g2p_lstm", ["lstm", "attention"], {"test/per": 0.3, "test/wer": 0.6}, task="g2p")
    return root


def test_ablate_gathers_every_run_into_a_table_and_a_plot(runs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "results"
    main(["ablate", f"runs={runs}", f"output_dir={out}", "batch_size=2", "new_tokens=4", "source_length=5",
          "repeats=1"])
    rows = read_results(out / "ablations.csv")
    assert [(row["task"], row["run"], row["seed"]) for row in rows] == [
        ("copy", "ablate_copy_attention", 0), ("copy", "ablate_copy_lstm", 0), ("copy", "ablate_copy_lstm", 1),
        ("copy", "ablate_copy_lstm", 2), ("g2p", "ablate_g2p_lstm", 0)]
    lstm = rows[1]
    assert lstm["decoder"] == "lstm x2" and lstm["layers"] == "2-2"  # the newer of the two seed-0 runs of that name
    assert lstm["test/cer"] == 0.105 and lstm["init"] == "scratch" and lstm["train_time_s"] == 12.5
    for row in rows:
        assert row["parameters"] > 0 and row["ms_per_token"] > 0 and row["decode_new_tokens"] == 4
    # One sequence's mixer state at 4 new tokens: the KV cache holds 4 positions, the LSTM its (h, c).
    config = tiny_model(["lstm"] * 2).config
    assert rows[0]["state_bytes"] == 2 * 2 * 4 * config.d_model * 4  # layers x (K, V) x steps x width x fp32
    assert rows[1]["state_bytes"] == 2 * 2 * config.d_model * 4  # layers x (h, c) x width x fp32
    d = config.d_model
    assert rows[0]["mixer_parameters"] == 4 * d * d + 4 * d  # qkv and out, with biases
    assert rows[4]["decoder"] == "lstm,attention" and rows[4]["test/per"] == 0.3

    # The three seeds of ablate_copy_lstm are one configuration: cer 0.105/0.115/0.125, time 12.5/14.5/16.5.
    with open(out / "ablations_grouped.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert "seeds" in header and "seed" not in header
    assert header.index("test/cer_std") == header.index("test/cer") + 1
    grouped = read_results(out / "ablations_grouped.csv")
    assert [(row["run"], row["seeds"]) for row in grouped] == [
        ("ablate_copy_attention", 1), ("ablate_copy_lstm", 3), ("ablate_g2p_lstm", 1)]
    pooled = grouped[1]
    assert pooled["test/cer"] == pytest.approx(0.115) and pooled["test/cer_std"] == pytest.approx(0.01)
    assert pooled["train_time_s"] == pytest.approx(14.5) and pooled["train_time_s_std"] == pytest.approx(2.0)
    assert pooled["test/exact_match_std"] == pytest.approx(0.0) and pooled["ms_per_token_std"] is not None
    assert grouped[0]["test/cer_std"] is None and grouped[0]["ms_per_token_std"] is None  # one seed: no spread

    table = (out / "ablations.md").read_text()
    assert "batch 2, 4 new tokens" in table and "| ablate_g2p_lstm |" in table
    assert "| copy | ablate_copy_lstm | lstm x2 | 2-2 | - | scratch | 0 | 0 | 3 |" in table
    assert "| 14.5 ± 2.0 | 1,000 ± 0 |" in table and "| 0.115 ± 0.010 |" in table
    assert "Every run, one row per seed:" in table and "Targets" not in table  # the library knows no targets
    assert table.count("| copy | ablate_copy_lstm |") == 4  # the configuration, then its three seeds
    header = (out / "pareto.png").read_bytes()[:24]  # a PNG of one 6.4 x 4.8 in panel per task, at 120 dpi
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert [int.from_bytes(header[at:at + 4], "big") for at in (16, 20)] == [2 * 768, 576]
    assert "ablate_copy_attention" in capsys.readouterr().out

    # The grid's targets, by the committed command that checks them beside the tables.
    monkeypatch.setattr(sys, "argv", ["targets.py", str(out)])
    TARGETS["main"]()
    assert ("all-LSTM test/cer within 10% of all-attention's (<= +10%): 0.115 ± 0.010 vs 0.100 "
            "(+15.0%, n=1, significance unknown), MISSED") in (out / "targets.md").read_text()


def test_rows_collected_earlier_join_the_table_and_a_run_collected_now_replaces_its_row(runs, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    settings = ["batch_size=2", "new_tokens=4", "source_length=5", "repeats=1"]
    main(["ablate", f"runs={runs / 'b'}", f"output_dir={first}", *settings])  # the G2P run, collected alone
    earlier = read_results(first / "ablations.csv")
    (g2p,) = earlier
    g2p["test/per"] = 0.25  # what an earlier collection said; the run under `runs` says 0.3
    extra = dict(g2p, run="ablate_g2p_gone", seed=4)  # a run whose folder is gone
    (first / "ablations.csv").write_text("")
    with open(first / "ablations.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(g2p))
        writer.writeheader()
        writer.writerows([g2p, extra])
    main(["ablate", f"runs={runs / 'a'}", f"output_dir={second}", f"include={first / 'ablations.csv'}", *settings])
    rows = read_results(second / "ablations.csv")
    assert [(row["run"], row["seed"]) for row in rows] == [
        ("ablate_copy_attention", 0), ("ablate_copy_lstm", 0), ("ablate_copy_lstm", 1), ("ablate_copy_lstm", 2),
        ("ablate_g2p_gone", 4), ("ablate_g2p_lstm", 0)]
    assert rows[-1]["test/per"] == 0.25 and rows[-1]["ms_per_token"] == g2p["ms_per_token"]  # as collected then
    assert rows[-2]["task"] == "g2p"  # a run whose folder is gone keeps the task its CSV recorded
    assert "2 of the runs were collected earlier and read from" in (second / "ablations.md").read_text()

    main(["ablate", f"runs=[{runs / 'a'},{runs / 'b'}]", f"output_dir={second}",
          f"include={first / 'ablations.csv'}", *settings])
    rows = read_results(second / "ablations.csv")
    assert [row["test/per"] for row in rows if row["run"] == "ablate_g2p_lstm"] == [0.3]  # collected now wins
    assert "1 of the runs were collected earlier" in (second / "ablations.md").read_text()


def test_seeds_of_one_configuration_pool_into_mean_std_and_count():
    def run(seed, steps, per, ms):
        return {"task": "g2p", "run": "ablate_g2p_lstm", "decoder": "lstm x3", "steps": steps, "seed": seed,
                "parameters": 1000, "train_time_s": 10.0 + seed, "ms_per_token": ms, "test/per": per}

    rows = [run(0, 500, 0.20, 1.0), run(1, 500, 0.30, 1.2), run(2, 500, 0.40, 1.4), run(0, 600, 0.25, 1.1)]
    five_hundred, six_hundred = group_seeds(rows)  # same name, different steps: two configurations
    assert five_hundred["seeds"] == 3 and "seed" not in five_hundred and five_hundred["steps"] == 500
    assert five_hundred["parameters"] == 1000  # a configuration's own columns are kept as they are
    assert five_hundred["test/per"] == pytest.approx(0.30)
    assert five_hundred["test/per_std"] == pytest.approx(0.10)  # sample std, n - 1: population std is 0.0816
    assert five_hundred["test/per_std"] == pytest.approx(statistics.stdev([0.20, 0.30, 0.40]))
    assert five_hundred["ms_per_token"] == pytest.approx(1.2) and five_hundred["ms_per_token_std"] == pytest.approx(0.2)
    assert five_hundred["train_time_s"] == pytest.approx(11.0)
    assert five_hundred["train_time_s_std"] == pytest.approx(1.0)
    assert six_hundred["seeds"] == 1 and six_hundred["test/per"] == 0.25
    assert six_hundred["test/per_std"] is None and six_hundred["ms_per_token_std"] is None  # one seed: no fake std
    assert group_seeds([five_hundred, six_hundred]) == [five_hundred, six_hundred]  # grouped rows pass through
    table = markdown_table([five_hundred, six_hundred])
    assert "| seeds |" in table and "| 3 |" in table and "| 0.300 ± 0.100 |" in table
    assert "| 1 |" in table and "| 0.250 |" in table and "0.250 ±" not in table


def test_a_difference_inside_the_spread_between_seeds_is_not_significant():
    def configuration(name, per_by_seed):
        return [{"task": "g2p", "run": f"ablate_g2p_{name}", "seed": seed, "steps": 500, "test/per": per,
                 "test/exact_match": 0.5} for seed, per in enumerate(per_by_seed)]

    attention, lstm, far, single = group_seeds(
        configuration("attention", [0.20, 0.22, 0.24]) + configuration("lstm", [0.23, 0.25, 0.27])
        + configuration("far", [0.50, 0.51, 0.52]) + configuration("single", [0.21]))
    # Means 0.22 and 0.25, both std 0.02: the gap of 0.03 lies inside 0.02 + 0.02.
    assert significant(lstm, attention, "test/per") is False
    assert significant(far, attention, "test/per") is True  # 0.29 apart, spread 0.03
    assert significant(single, attention, "test/per") is None  # one seed has no spread
    assert significant(attention, attention, "test/exact_match") is False  # equal means, no spread at all
    lstm_rows = configuration("attention", [0.20, 0.22, 0.24]) + configuration("lstm", [0.23, 0.25, 0.27])
    (check,) = targets(lstm_rows)
    assert check["significant"] is False and check["met"] is False  # +13.6% on the means, but within the noise
    assert check["measured"] == "0.250 ± 0.020 vs 0.220 ± 0.020 (+13.6%, not significant)"
    (check,) = targets(configuration("attention", [0.20, 0.22, 0.24]) + configuration("lstm", [0.50, 0.51, 0.52]))
    assert check["significant"] is True and check["measured"].endswith("(+131.8%, significant)")
    (check,) = targets(configuration("attention", [0.20]) + configuration("lstm", [0.23, 0.25, 0.27]))
    assert check["significant"] is None and "n=1, significance unknown" in check["measured"]


def test_a_converted_configuration_is_compared_with_the_spread_of_its_seeds():
    def runs(run, decoder, init, steps, total, per_by_seed):
        return [{"task": "g2p", "run": run, "decoder": decoder, "init": init, "steps": steps, "total_steps": total,
                 "seed": seed, "test/per": per} for seed, per in enumerate(per_by_seed)]

    rows = (runs("attention", "attention x3", "scratch", 500, 500, [0.20, 0.21, 0.22])
            + runs("lstm_600", "lstm x3", "scratch", 600, 600, [0.40, 0.41, 0.42])
            + runs("convert_lstm", "lstm x3", "converted from attention x3", 100, 600, [0.20, 0.22, 0.24]))
    table = conversions(rows)
    assert ("| g2p | lstm x3 | 100 of 600 | test/per 0.220 ± 0.020 | test/per 0.410 ± 0.010 | test/per 0.210 ± 0.010 "
            "| -0.190, significant | +0.010, not significant |") in table


def test_committed_one_seed_results_read_back_as_one_seed_per_configuration():
    for path in sorted(ROOT.glob("results/*/ablations.csv")):
        rows = read_results(path)
        if any(row["seed"] != 0 for row in rows):
            continue  # several seeds: test_committed_tables_are_what_their_rows_give
        grouped = group_seeds(rows)
        assert len(grouped) == len(rows) and {row["seeds"] for row in grouped} == {1}, path
        assert all(row.get("test/loss_std") is None for row in grouped)
        assert [row["run"] for row in grouped] == [row["run"] for row in rows]
        assert "| seeds |" in markdown_table(grouped)
        checks = targets(rows)
        assert all(check["significant"] is None for check in checks)
        assert all("n=1, significance unknown" in check["measured"] for check in checks)


@pytest.mark.parametrize("folder", sorted(path.parent.name for path in ROOT.glob("results/*/ablations_grouped.csv")))
def test_committed_tables_are_what_their_rows_give(folder, tmp_path):
    """No committed table or target line is edited by hand: each follows from its own ablations.csv."""
    committed = ROOT / "results" / folder
    note = (committed / "ablations.md").read_text().split("\n\n", 1)[0]
    rows = read_results(committed / "ablations.csv")
    write_results(rows, tmp_path, note)
    for name in ("ablations.md", "ablations_grouped.csv"):
        assert (tmp_path / name).read_text() == (committed / name).read_text(), name
    if targets(rows):  # a grid with the arms the targets compare
        assert (committed / "targets.md").read_text() == targets_markdown(rows)
        assert f"python {TARGETS_SCRIPT.relative_to(ROOT)} results/{folder}" in (committed / "run.sh").read_text()


def test_issue_15s_targets_hold_the_parameter_matched_lstm_to_5_percent_and_the_wider_one_to_no_worse():
    def configuration(name, per_by_seed):
        return [{"task": "g2p", "run": f"ablate_g2p_{name}", "seed": seed, "steps": 500, "test/per": per}
                for seed, per in enumerate(per_by_seed)]

    rows = (configuration("attention", [0.20, 0.21, 0.22]) + configuration("param_matched", [0.20, 0.21, 0.23])
            + configuration("lstm", [0.21, 0.22, 0.24]))
    checks = {check["target"]: check for check in targets(rows)}
    matched = checks["parameter-matched all-LSTM test/per within 5% of all-attention's"]
    assert matched["met"] is True and "(+1.6%, not significant)" in matched["measured"]
    wider = checks["equal-width all-LSTM test/per no worse than the parameter-matched one"]
    assert wider["met"] is True and wider["significant"] is False  # worse on the means, inside the spread
    rows = configuration("attention", [0.20, 0.21, 0.22]) + configuration("param_matched", [0.20, 0.21, 0.22]) \
        + configuration("lstm", [0.40, 0.45, 0.50])
    wider = {check["target"]: check for check in targets(rows)}[
        "equal-width all-LSTM test/per no worse than the parameter-matched one"]
    assert wider["met"] is False and wider["significant"] is True
    (alone,) = [check for check in targets(configuration("lstm", [0.3]) + configuration("param_matched", [0.2]))]
    assert alone["met"] is False and alone["significant"] is None  # one seed each: judged on the values


def test_arms_trained_alike_are_judged_by_their_shared_suffix():
    def configuration(name, per_by_seed):
        return [{"task": "g2p", "run": f"ablate_g2p_{name}", "seed": seed, "steps": 500, "test/per": per}
                for seed, per in enumerate(per_by_seed)]

    rows = (configuration("attention", [0.20, 0.21, 0.22]) + configuration("lstm", [0.40, 0.41, 0.42])
            + configuration("attention_lr_1e-3", [0.30, 0.31, 0.32]) + configuration("lstm_lr_1e-3", [0.30, 0.30, 0.31])
            + configuration("attention_first", [0.10]) + configuration("lstm_equal_total", [0.10]))
    checks = {check["target"]: check for check in targets(rows)}
    assert list(checks) == ["all-LSTM test/per within 10% of all-attention's",  # the grid's defaults first
                            "all-LSTM test/per within 10% of all-attention's [lr_1e-3]"]
    assert checks["all-LSTM test/per within 10% of all-attention's"]["met"] is False
    assert "0.303 ± 0.006 vs 0.310 ± 0.010" in checks["all-LSTM test/per within 10% of all-attention's [lr_1e-3]"][
        "measured"]  # each suffix's arms against each other, never against another suffix's


def test_validation_curves_name_each_run_by_its_folder_and_keep_only_validation_rows(tmp_path):
    for run, rows in {"lstm/seed0": "0,99,,0.50\n0,99,0.30,\n1,199,0.25,\n", "attention": "0,99,0.40,\n"}.items():
        (tmp_path / run / "csv").mkdir(parents=True)
        (tmp_path / run / "csv" / "metrics.csv").write_text("epoch,step,val/per,train/loss\n" + rows)
    write_validation_curves(tmp_path, "val/per", tmp_path / "curves.csv")
    assert (tmp_path / "curves.csv").read_text() == (
        "run,step,val_per\nattention,100,0.4000\nlstm/seed0,100,0.3000\nlstm/seed0,200,0.2500\n")


def test_targets_and_pareto_front():
    rows = [{"task": "g2p", "run": "ablate_g2p_attention", "test/per": 0.20, "test/exact_match": 0.50, "steps": 600},
            {"task": "g2p", "run": "ablate_g2p_lstm", "test/per": 0.23, "test/exact_match": 0.40, "steps": 600},
            {"task": "g2p", "run": "ablate_g2p_convert", "test/per": 0.21, "test/exact_match": 0.48, "steps": 120}]
    checks = targets(rows)
    assert [check["met"] for check in checks] == [False, True]
    assert "+15.0%" in checks[0]["measured"] and "96.0%" in checks[1]["measured"]
    assert pareto_front([(1.0, 0.5), (2.0, 0.2), (2.0, 0.6), (3.0, 0.2)]) == [0, 1]


def test_a_converted_run_stands_beside_scratch_at_equal_total_steps_and_its_source():
    def row(run, decoder, init, steps, total, per, exact):
        return {"task": "g2p", "run": run, "decoder": decoder, "init": init, "steps": steps, "total_steps": total,
                "test/per": per, "test/exact_match": exact}

    rows = [row("attention", "attention x3", "scratch", 500, 500, 0.20, 0.50),
            row("gru_600", "gru x3", "scratch", 600, 600, 0.30, 0.35),
            row("gru_500", "gru x3", "scratch", 500, 500, 0.90, 0.01),
            row("convert_gru", "gru x3", "converted from attention x3", 100, 600, 0.25, 0.45),
            row("convert_t2r", "t2r x3", "converted from attention x3", 100, 600, 0.22, 0.48)]
    table = conversions(rows)
    assert ("| g2p | gru x3 | 100 of 600 | test/per 0.250, exact match 0.450 | test/per 0.300, exact match 0.350 "
            "| test/per 0.200, exact match 0.500 |") in table
    assert "| g2p | t2r x3 | 100 of 600 | test/per 0.220, exact match 0.480 | - |" in table  # no scratch run
    assert "| -0.050, n=1, significance unknown | +0.050, n=1, significance unknown |" in table  # the gru row
    assert conversions(rows[:3]) == ""


def test_the_pareto_plot_draws_each_configuration_at_its_means_with_its_spread():
    def configuration(task, name, ms_and_per_by_seed):
        return [{"task": task, "run": f"ablate_{task}_{name}", "seed": seed, "steps": 500, "ms_per_token": ms,
                 "test/per" if task == "g2p" else "test/cer": per, "decode_batch": 8, "decode_new_tokens": 128}
                for seed, (ms, per) in enumerate(ms_and_per_by_seed)]

    rows = (configuration("g2p", "attention", [(2.0, 0.20)])
            + configuration("g2p", "lstm", [(1.0, 0.22), (1.2, 0.26), (1.4, 0.30)])  # mean (1.2, 0.26), std (.2, .04)
            + configuration("g2p", "slow_and_bad", [(3.0, 0.40)])
            + configuration("copy", "lstm", [(0.5, 0.1)]))
    figure = pareto_figure(rows)
    copy, g2p = figure.axes  # one panel per task, in order
    assert (copy.get_title(), g2p.get_title()) == ("copy", "g2p (mean ± std over seeds)")
    assert g2p.get_xlabel() == "greedy decoding, ms per token (batch 8, 128 new tokens)"
    assert (g2p.get_ylabel(), copy.get_ylabel()) == ("test/per (lower is better)", "test/cer (lower is better)")
    (points,) = g2p.containers  # one errorbar set: one marker per configuration, at its means
    marker, _, (xerr, yerr) = points.lines
    assert marker.get_xdata().tolist() == pytest.approx([2.0, 1.2, 3.0])
    assert marker.get_ydata().tolist() == pytest.approx([0.20, 0.26, 0.40])
    # Each bar's two ends, (x, y) and (x, y): the lstm's spans its mean ± std; one seed has no spread.
    assert yerr.get_segments()[1].ravel().tolist() == pytest.approx([1.2, 0.22, 1.2, 0.30])
    assert xerr.get_segments()[1].ravel().tolist() == pytest.approx([1.0, 0.26, 1.4, 0.26])
    assert yerr.get_segments()[0].ravel().tolist() == pytest.approx([2.0, 0.20, 2.0, 0.20])
    assert [text.get_text() for text in g2p.texts] == ["attention", "lstm (n=3)", "slow_and_bad"]
    assert [value for text in g2p.texts for value in text.xy] == pytest.approx([2.0, 0.20, 1.2, 0.26, 3.0, 0.40])
    (front,) = [line for line in g2p.get_lines() if line.get_label() == "Pareto front"]
    assert [*front.get_xdata(), *front.get_ydata()] == pytest.approx([1.2, 2.0, 0.26, 0.20])
    assert [text.get_text() for text in copy.texts] == ["lstm"]


def test_the_options_column_names_only_what_differs_from_the_defaults():
    assert changed_options(tiny_model(["lstm", "t2r"]).config) is None
    config = tiny_model(["lstm", "t2r"], mixer_options={"lstm": {"hidden_size": 24}, "t2r": {"feature_size": 8}}).config
    assert changed_options(config) == "lstm.hidden_size=24 t2r.feature_size=8"


def test_training_clock_writes_time_and_tokens(tmp_path):
    overrides = ["experiment=ablate_recall_lstm", "debug=fast", f"paths.output_dir={tmp_path}"]
    with initialize_config_module(config_module="hybrid.configs", version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.data.train_size, cfg.data.val_size, cfg.data.test_size, cfg.data.batch_size = 16, 8, 8, 8
    run_fit(cfg)
    clock = json.loads((tmp_path / CLOCK_FILE).read_text())
    assert clock["global_step"] == 1 and clock["train_tokens"] >= 8 * 18  # 8 targets of 17+ tokens, plus EOS
    assert clock["train_time_s"] >= clock["train_batch_time_s"] > 0 and clock["train_tokens_per_s"] > 0


def test_ablation_notebook_runs_on_a_results_table(tmp_path, monkeypatch):
    rows = [{"task": "recall", "run": f"ablate_recall_{name}", "decoder": name, "steps": steps, "parameters": 1000,
             "ms_per_token": ms, "decode_batch": 8, "decode_new_tokens": 128, "test/cer": cer,
             "test/exact_match": match}
            for name, steps, ms, cer, match in [("attention", 600, 2.0, 0.1, 0.5), ("lstm", 600, 1.0, 0.3, 0.2),
                                                ("convert", 120, 1.0, 0.2, 0.45)]]
    write_results(rows, tmp_path)
    monkeypatch.setenv("HYBRID_ABLATION_RESULTS", str(tmp_path / "ablations.csv"))
    monkeypatch.chdir(ROOT / "notebooks")
    namespace = execute_notebook(ROOT / "notebooks" / "ablations.ipynb")
    assert len(namespace["rows"]) == 3 and namespace["figure"].axes
