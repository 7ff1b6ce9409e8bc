"""The floor beside every benchmark cell: the bytes a decode step reads, checked against an
independent count by parameter name and against the decoding state the model really allocates, over
a bandwidth measured from timings the test controls, and the cache that decides whether it applies."""

import pytest
import torch

from hybrid.bench import floor, runner
from hybrid.bench.contenders import Contender, bart_model, model_config
from hybrid.bench.floor import StepReads, bart_reads, seq2seq_reads
from hybrid.bench.runner import _summarise
from hybrid.mixers import MIXERS
from hybrid.model import Seq2Seq

SHAPE = {"vocab_size": 32, "d_model": 16, "n_heads": 2, "d_ff": 32, "encoder_layers": 1, "decoder_layers": 2,
         "max_positions": 64}


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_our_weights_are_the_decoder_but_the_memory_projections(mixer):
    model = Seq2Seq(model_config(SHAPE, mixer))
    decoder = sum(nbytes(p) for name, p in model.named_parameters()
                  if name.startswith(("decoder_layers.", "decoder_norm.")) and ".cross.key_value." not in name)
    head = nbytes(model.lm_head.weight)  # tied to the embedding: the head reads it all, the input one row
    assert seq2seq_reads(model).weights == decoder + head + SHAPE["d_model"] * 4


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_our_int8_weights_are_one_byte_an_element_and_one_scale_a_matrix(mixer):
    model = Seq2Seq(model_config(SHAPE, mixer))
    matrices = [p for name, p in model.named_parameters() if p.dim() == 2 and name.startswith("decoder_layers.")
                and ".cross.key_value." not in name] + [model.lm_head.weight]
    saved = seq2seq_reads(model).weights - seq2seq_reads(model, int8=True).weights
    assert saved == sum(4 * m.numel() - (m.numel() + 4) for m in matrices)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
@pytest.mark.parametrize("steps", [1, 7, 40])
def test_our_state_is_the_state_start_allocates_grown_to_its_last_step(mixer, steps):
    model = Seq2Seq(model_config(SHAPE, mixer))
    state = model.start(torch.randint(3, SHAPE["vocab_size"], (3, 5)), max_steps=steps)
    state.reserve(steps)  # a KV cache grows in buckets as it is fed; at the last step it holds every position
    assert seq2seq_reads(model).state_bytes(3, 5, steps) == state.nbytes - nbytes(state.memory_mask)


def test_a_kv_cache_step_reads_more_the_longer_the_decode_and_an_lstm_step_does_not():
    layers, width, element = SHAPE["decoder_layers"], SHAPE["d_model"], 4
    attention = seq2seq_reads(Seq2Seq(model_config(SHAPE, "attention")))
    lstm = seq2seq_reads(Seq2Seq(model_config(SHAPE, "lstm")))
    memory = layers * 2 * 8 * width * 2 * element  # layers x batch x source length x d_model x 2 x bytes
    # Step p (from 0) reads p + 1 positions of keys and values, (N + 1) / 2 on average over N steps:
    # 2 x layers x batch x position x d_model x bytes.
    for new_tokens in (1, 41):
        cache = 2 * layers * 2 * (new_tokens + 1) / 2 * width * element
        assert attention.per_step(2, 8, new_tokens) == attention.weights + memory + cache
    assert lstm.per_step(2, 8, 41) == lstm.per_step(2, 8, 1) > lstm.weights + memory


def test_bart_reads_its_decoder_but_the_memory_projections_and_one_row_of_each_table():
    model = bart_model(SHAPE)
    decoder = sum(nbytes(p) for name, p in model.named_parameters()
                  if name.startswith("model.decoder.") and not name.startswith("model.decoder.embed_")
                  and ".encoder_attn.k_proj." not in name and ".encoder_attn.v_proj." not in name)
    rows = 2 * SHAPE["d_model"] * 4  # a token embedding and a position embedding
    assert bart_reads(model, 4).weights == decoder + nbytes(model.lm_head.weight) + rows
    layers, width = SHAPE["decoder_layers"], SHAPE["d_model"]
    assert bart_reads(model, 4) == StepReads(bart_reads(model, 4).weights, 2 * layers * width * 4,
                                             state_per_position=2 * layers * width * 4)


def test_bart_in_int8_reads_one_byte_a_weight_plus_a_scale_a_row():
    model = bart_model(SHAPE)
    float32, int8 = bart_reads(model, 4), bart_reads(model, 4, int8=True)
    decoder = model.get_decoder()
    matrices = [m.weight for m in [*decoder.modules(), model.lm_head] if isinstance(m, torch.nn.Linear)
                and not any(m is layer.encoder_attn.k_proj or m is layer.encoder_attn.v_proj
                            for layer in decoder.layers)]
    matrices.append(decoder.embed_tokens.weight[:1])  # the token embedding's row; positions stay float
    assert float32.weights - int8.weights == sum(3 * m.numel() - 4 * m.shape[0] for m in matrices)
    assert float32.state_bytes(2, 8, 16) == int8.state_bytes(2, 8, 16)


def test_a_step_reads_the_weights_and_the_state_as_it_stands_midway_through_the_decode():
    reads = StepReads(weights=1000, memory_per_position=10, state=7, state_per_position=3)
    # 2 rows of 8 source positions: 2 x (10 x 8 + 7 + 3 x steps) bytes once `steps` tokens are fed.
    assert reads.state_bytes(2, 8, 4) == 2 * (80 + 7 + 12)
    # Step p (from 0) of 5 reads the state after p + 1 tokens: the mean of the five is 1000 + 2 x 96.
    steps = [reads.weights + reads.state_bytes(2, 8, p + 1) for p in range(5)]
    assert reads.per_step(2, 8, 5) == sum(steps) / 5 == 1192


def test_the_floor_is_the_bytes_of_a_step_over_the_bandwidth():
    reads = StepReads(weights=1000, memory_per_position=10, state=7, state_per_position=3)
    contender = Contender("fake", 1, prefill=None, generate=None, state_bytes=lambda *shape: 1, step_reads=reads)
    repeats = [{"prefill_s": 0.0, "total_s": 0.005, "peak_bytes": None, "decoded_tokens": 5}]
    row = _summarise(contender, repeats, 2, 5, {"source_length": 8}, torch.device("cpu"), bandwidth=2e6)
    assert row["step_bytes"] == 1192
    assert row["floor_ms_per_token"] == pytest.approx(1000 * 1192 / 2e6)  # 0.596 ms
    assert row["x_floor"] == pytest.approx(1.0 / 0.596)  # 1 ms a token


def test_summary_divides_by_the_tokens_prefill_leaves_and_sets_the_floor_beside_them():
    reads = StepReads(weights=1_000_000, memory_per_position=0)
    # A prefill of 2 s that decodes one token, then 2 + 9 x 0.5 s for ten tokens: 0.5 s a token.
    contender = Contender("fake", 1, prefill=None, generate=None, state_bytes=lambda *shape: 1, step_reads=reads,
                          prefill_steps=1)
    repeats = [{"prefill_s": 2.0, "total_s": 6.5, "peak_bytes": None, "decoded_tokens": 10}] * 2
    row = _summarise(contender, repeats, 1, 10, {"source_length": 8}, torch.device("cpu"), bandwidth=1e9)
    assert row["ms_per_token"] == pytest.approx(500.0)
    assert row["step_bytes"] == 1_000_000 and row["floor_ms_per_token"] == pytest.approx(1.0)
    assert row["x_floor"] == pytest.approx(500.0)


def test_bandwidth_is_the_bytes_a_copy_reads_and_writes_over_its_median_time(monkeypatch):
    seconds, copied = iter([0.004, 0.001, 0.002]), []

    def timed(device, call):
        copied.append(call().nbytes)  # what is timed is the copy of the whole buffer
        return next(seconds), None

    monkeypatch.setattr(runner, "timed", timed)
    bandwidth = runner.measure_bandwidth(torch.device("cpu"), buffer_mib=1, repeats=3)
    assert copied == [2**20] * 3
    assert bandwidth == 2 * 2**20 / 0.002  # each byte read once and written once, over the median time


def test_the_last_level_cache_is_the_highest_level_of_data_the_cpu_lists(monkeypatch, tmp_path):
    def cache(index: int, level: int, kind: str, size: str) -> None:
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (folder / name).write_text(f"{text}\n")

    monkeypatch.setattr(floor, "Path", lambda path: tmp_path)  # the sysfs folder it reads
    assert floor.last_level_cache_bytes(torch.device("cpu")) == floor.ASSUMED_CACHE_BYTES  # none listed
    cache(0, 1, "Data", "48K")
    cache(1, 1, "Instruction", "32K")
    cache(2, 2, "Unified", "2M")
    assert floor.last_level_cache_bytes(torch.device("cpu")) == 2 * 2**20
    cache(3, 3, "Unified", "36864K")
    cache(4, 4, "Instruction", "1G")  # not data: never the answer
    assert floor.last_level_cache_bytes(torch.device("cpu")) == 36864 * 2**10
