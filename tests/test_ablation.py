"""`hybrid ablate` on fake runs, the training clock in a real one, and the ablation notebook on a tiny table."""

import csv
import json
import os
import time
from pathlib import Path

import pytest
from conftest import execute_notebook, tiny_model
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from hybrid.ablation import CLOCK_FILE, changed_options, conversions, pareto_front, read_results, targets, write_results
from hybrid.cli import main
from hybrid.cli.train import run_fit
from hybrid.training import Seq2SeqTokenizer
from hybrid.training.checkpoint import write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
ALPHABET = "abcdefghi"  # 4 specials + 9 letters: the tiny models' 13-token vocabulary


def fake_run(folder: Path, name: str, mixers: list[str], metrics: dict[str, float], task: str = "copy") -> Path:
    """A folder shaped like a `hybrid fit` run: composed config, last.ckpt, metrics.csv, training clock."""
    tokenizer = Seq2SeqTokenizer.train([ALPHABET], [ALPHABET], "char", "char")
    model = tiny_model(mixers, seed=len(name))
    assert tokenizer.vocab_size == model.config.vocab_size
    write_checkpoint(model, tokenizer, folder / "checkpoints" / "last.ckpt")
    data = ({"_target_": "hybrid.training.G2PDataModule"} if task == "g2p"
            else {"_target_": "hybrid.training.SyntheticDataModule", "task": task})
    (folder / ".hydra").mkdir(parents=True)
    OmegaConf.save(OmegaConf.create({"name": name, "seed": 0, "data": data}), folder / ".hydra" / "config.yaml")
    (folder / "csv").mkdir()
    with open(folder / "csv" / "metrics.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["epoch", "step", "val/loss", *metrics])
        writer.writeheader()
        writer.writerow({"epoch": 0, "step": 10, "val/loss": 1.0})
        writer.writerow({"epoch": 0, "step": 10, **metrics})
    (folder / CLOCK_FILE).write_text(json.dumps({"train_time_s": 12.5, "train_tokens_per_s": 1000.0}))
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
    fake_run(root / "b", "ablate_g2p_lstm", ["lstm", "attention"], {"test/per": 0.3, "test/wer": 0.6}, task="g2p")
    return root


def test_ablate_gathers_every_run_into_a_table_and_a_plot(runs, tmp_path, capsys):
    out = tmp_path / "results"
    main(["ablate", f"runs={runs}", f"output_dir={out}", "batch_size=2", "new_tokens=4", "source_length=5",
          "repeats=1"])
    rows = read_results(out / "ablations.csv")
    assert [(row["task"], row["run"]) for row in rows] == [
        ("copy", "ablate_copy_attention"), ("copy", "ablate_copy_lstm"), ("g2p", "ablate_g2p_lstm")]
    lstm = rows[1]
    assert lstm["decoder"] == "lstm x2" and lstm["layers"] == "2-2"  # the newer of the two runs of that name
    assert lstm["test/cer"] == 0.105 and lstm["init"] == "scratch" and lstm["train_time_s"] == 12.5
    for row in rows:
        assert row["parameters"] > 0 and row["ms_per_token"] > 0 and row["decode_new_tokens"] == 4
    # One sequence's mixer state at 4 new tokens: the KV cache holds 4 positions, the LSTM its (h, c).
    config = tiny_model(["lstm"] * 2).config
    assert rows[0]["state_bytes"] == 2 * 2 * 4 * config.d_model * 4  # layers x (K, V) x steps x width x fp32
    assert rows[1]["state_bytes"] == 2 * 2 * config.d_model * 4  # layers x (h, c) x width x fp32
    d = config.d_model
    assert rows[0]["mixer_parameters"] == 4 * d * d + 4 * d  # qkv and out, with biases
    assert rows[2]["decoder"] == "lstm,attention" and rows[2]["test/per"] == 0.3
    table = (out / "ablations.md").read_text()
    assert "batch 2, 4 new tokens" in table and "| ablate_g2p_lstm |" in table
    assert "all-LSTM test/cer within 10% of all-attention's" in table and "(+5.0%), met" in table
    assert (out / "pareto.png").stat().st_size > 0
    assert "ablate_copy_attention" in capsys.readouterr().out


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
    assert conversions(rows[:3]) == ""


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
