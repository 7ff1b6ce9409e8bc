"""The CTranslate2 contender: BART converted by CTranslate2's own converter decodes exactly N tokens,
the same ones as transformers' generate() from the same ids, and is skipped cleanly without the package."""

import logging
import sys

import pytest
import torch

from hybrid.bench.contenders import bart_model, ctranslate2_bart

pytest.importorskip("ctranslate2")

SHAPE = {"vocab_size": 32, "d_model": 16, "n_heads": 2, "d_ff": 32, "encoder_layers": 1, "decoder_layers": 2,
         "max_positions": 64}


@pytest.fixture(scope="module")
def varied_bart():
    """A BART whose greedy tokens depend on its input (the default initialisation repeats one token)."""
    torch.manual_seed(0)
    model = bart_model(SHAPE)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" not in name:
                parameter.normal_(0.0, 0.5 if parameter.dim() > 1 else 0.1)
    return model


@pytest.fixture(scope="module")
def rows(varied_bart):
    return {row.name: row for row in ctranslate2_bart(varied_bart, ["float32", "int8"], threads=1, device="cpu")}


def source(batch: int, length: int) -> torch.Tensor:
    return torch.randint(3, SHAPE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


def test_a_row_per_compute_type_with_the_models_parameters(rows, varied_bart):
    assert set(rows) == {"bart-ct2-float32", "bart-ct2-int8"}
    for row in rows.values():
        assert row.parameters == sum(p.numel() for p in varied_bart.parameters())
        assert row.prefill_steps == 1
    assert rows["bart-ct2-int8"].step_reads.weights < rows["bart-ct2-float32"].step_reads.weights


@pytest.mark.parametrize("name", ["bart-ct2-float32", "bart-ct2-int8"])
@pytest.mark.parametrize("new_tokens", [1, 5, 40])
def test_it_decodes_exactly_n_tokens_and_its_prefill_one(rows, name, new_tokens):
    tokens = rows[name].generate(source(3, 7), new_tokens)
    assert tokens.shape == (3, new_tokens)
    assert ((tokens >= 0) & (tokens < SHAPE["vocab_size"])).all()
    assert [len(result.hypotheses[0]) for result in rows[name].prefill(source(3, 7))] == [1, 1, 1]


def test_float32_decodes_the_tokens_transformers_decodes_from_the_same_ids(rows, varied_bart):
    # Any extra source EOS, another start token or a shifted vocabulary would change the tokens.
    src = source(4, 9)
    expected = varied_bart.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=12, min_new_tokens=12,
                                    do_sample=False, num_beams=1)[:, 1:]  # without the decoder start token
    assert len(set(expected.flatten().tolist())) > 3  # varied, so the comparison means something
    assert torch.equal(rows["bart-ct2-float32"].generate(src, 12), expected)


def test_without_ctranslate2_there_are_no_rows_and_a_note_says_why(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # makes `import ctranslate2` raise ImportError
    with caplog.at_level(logging.WARNING):
        assert ctranslate2_bart(bart_model(SHAPE), ["float32"], threads=1, device="cpu") == []
    assert "ctranslate2 is not installed" in caplog.text


def test_a_compute_type_the_device_lacks_is_skipped_with_a_note(varied_bart, monkeypatch, caplog):
    import ctranslate2

    monkeypatch.setattr(ctranslate2, "get_supported_compute_types", lambda device, index=0: {"float32"})
    with caplog.at_level(logging.WARNING):
        made = ctranslate2_bart(varied_bart, ["float32", "int8"], threads=1, device="cpu")
    assert [row.name for row in made] == ["bart-ct2-float32"]
    assert "does not support compute type int8" in caplog.text


def test_the_benchmarks_beam_strategy_decodes_what_transformers_beam_search_decodes(varied_bart):
    # generation.num_beams reaches CTranslate2 as beam_size (hybrid.bench.contenders.ctranslate2_options): with
    # every hypothesis exactly N tokens long, both searches keep the best-scoring one.
    src = source(4, 9)
    row = ctranslate2_bart(varied_bart, ["float32"], threads=1, device="cpu", generation={"num_beams": 3})[0]
    expected = varied_bart.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=8, min_new_tokens=8,
                                    do_sample=False, num_beams=3)[:, 1:]
    assert torch.equal(row.generate(src, 8), expected)
