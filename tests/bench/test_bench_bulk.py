"""`hybrid bench-bulk` on a tiny model: every mode of every decoder decodes the same outputs, the results
files have their schema, and the memory run samples a real bulk job."""

import json

import pytest
import torch
from conftest import tiny_model
from hydra import compose, initialize_config_module

from hybrid.bench.bulk import MODES, markdown_table, plain_loop, run_bulk_benchmark
from hybrid.cli.bench import run_bench_bulk
from hybrid.generation.refill import RefillDecoder
from hybrid.tokenizer import Seq2SeqTokenizer

LETTERS = "abcdefghijklmnopqrstuvwxyz'-."


@pytest.fixture(scope="module")
def g2p_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("g2p")
    tokenizer = Seq2SeqTokenizer.train([LETTERS], [LETTERS])
    tiny_model(["lstm", "lstm"], seed=2, vocab_size=tokenizer.vocab_size).save_pretrained(folder)
    tokenizer.save(folder)
    return folder


def test_bench_bulk_runs_every_mode_with_equal_outputs(g2p_checkpoint, tmp_path):
    overrides = [f"output_dir={tmp_path}", "g2p.limit=150", "g2p.max_new_tokens=12", "g2p.chunk_size=50",
                 "batch_size=16", "max_tokens=256", "window=40", f"g2p.checkpoints.lstm={g2p_checkpoint}",
                 "g2p.decoders=[lstm]", "memory.limit=300", "step_cost.rows=[1,4]", "step_cost.repeats=2",
                 "memory.sample_every_s=0.01", "synthetic.count=24",
                 "synthetic.repeats=2", "synthetic.max_source_length=12", "synthetic.generation.max_new_tokens=20",
                 "model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.encoder_layers=1",
                 "model.decoder_layers=2", "model.vocab_size=16"]
    with initialize_config_module(config_module="hybrid.configs", version_base="1.3"):
        cfg = compose("bench_bulk", overrides=overrides)
    torch_threads = torch.get_num_threads()
    try:
        run_bench_bulk(cfg)
    finally:
        torch.set_num_threads(torch_threads)
    results = json.loads((tmp_path / "results.json").read_text())
    assert {"device", "device_name", "torch", "threads", "git_commit", "date", "load_average",
            "models"} <= set(results["meta"])  # the bench's own metadata, as hybrid bench records it
    cells = {(row["dataset"], row["decoder"], row["mode"]) for row in results["rows"]}
    assert cells == {("g2p", "lstm", mode) for mode in MODES} | {("synthetic", decoder, mode) for mode in MODES
                                                                   for decoder in ("lstm", "attention")}
    for row in results["rows"]:
        assert (row["sequences"], row["rounds"]) == ((150, 3) if row["dataset"] == "g2p" else (24, 2))
        assert len(row["round_sequences_per_s"]) == row["rounds"]
        assert row["sequences_per_s"] > 0 and row["tokens_per_s"] > 0
        if row["dataset"] == "g2p":  # greedy: scheduling must not change a single output
            assert row["outputs_differing_from_first_mode"] == 0
    for ratio in results["ratios"]:
        assert ratio["round_speedup_min"] <= ratio["round_speedup_median"] <= ratio["round_speedup_max"]
        if ratio["mode"] == "input-order":
            assert ratio["speedup_over_input_order"] == ratio["round_speedup_max"] == 1.0
    cost = {(cell["dataset"], cell["decoder"], cell["rows"]) for cell in results["step_cost"]}
    assert cost == {(dataset, decoder, rows) for dataset, decoder in [("g2p", "lstm"), ("synthetic", "lstm"),
                                                                      ("synthetic", "attention")] for rows in (1, 4)}
    assert all(0 < cell["ms_per_step_min"] <= cell["ms_per_step"] for cell in results["step_cost"])
    memory = results["memory"]
    assert memory["inputs"] == 300 and memory["samples"] and memory["rss_mib_end"] > 0
    table = (tmp_path / "results.md").read_text()
    assert table == markdown_table(results) and "Memory over one `hybrid generate` job of 300 inputs" in table


def test_plain_loop_decodes_like_generate_without_shrinking():
    model = tiny_model(["lstm", "attention"], seed=3)
    src = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11], [4, 0, 0, 0]])
    expected = model.generate(src, src.ne(0), max_new_tokens=10)
    got = plain_loop(model, src, RefillDecoder(model, 3, max_new_tokens=10))
    assert torch.equal(got, expected[:, :got.shape[1]])
    assert got.shape[1] == expected.shape[1]  # both stop when the last row ends


def test_an_unknown_mode_is_refused_before_any_work():
    with pytest.raises(ValueError, match=r"unknown modes \['fast'\]; choose among"):
        run_bulk_benchmark({"modes": ["input-order", "fast"]})
