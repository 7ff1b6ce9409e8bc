"""Importing transformers encoder-decoders exactly, and exporting them back (hybrid.hf), for every family.

Every model is a tiny random one built locally with transformers (conftest.tiny_transformers_model);
nothing is downloaded.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TRANSFORMERS_FAMILIES, tiny_transformers_model, tiny_transformers_tokenizer

from hybrid import MIXERS, ModelConfig, Seq2Seq
from hybrid.hf.exporter import save_transformers

transformers = pytest.importorskip("transformers")


def padded_pair(config: ModelConfig, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded sources (rows of 7, 5 and 3 ids) ending in EOS, their mask, and decoder inputs from the start id."""
    generator = torch.Generator().manual_seed(seed)
    specials = {config.pad_id, config.eos_id, config.bos_id}
    ordinary = torch.tensor([i for i in range(config.vocab_size) if i not in specials])
    sources = torch.full((3, 7), config.pad_id)
    for row, length in enumerate((7, 5, 3)):
        sources[row, :length - 1] = ordinary[torch.randint(len(ordinary), (length - 1,), generator=generator)]
        sources[row, length - 1] = config.eos_id
    targets = ordinary[torch.randint(len(ordinary), (3, 6), generator=generator)]
    targets[:, 0] = config.bos_id
    return sources, sources != config.pad_id, targets


def transformers_logits(hf_model, sources, mask, targets) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(input_ids=sources, attention_mask=mask.long(), decoder_input_ids=targets).logits


@pytest.mark.parametrize("family", TRANSFORMERS_FAMILIES)
@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
def test_imported_logits_equal_transformers_forward_on_padded_batches(family, dtype, tolerance):
    hf_model = tiny_transformers_model(family, dtype=dtype)
    model = Seq2Seq.from_transformers(hf_model)
    sources, mask, targets = padded_pair(model.config)
    expected = transformers_logits(hf_model, sources, mask, targets)
    with torch.no_grad():
        logits = model(sources, targets, mask)
    assert logits.dtype == dtype
    torch.testing.assert_close(logits, expected, atol=tolerance, rtol=0)
    assert expected.abs().max() > 1.0  # wide random weights: a mapping mistake could not hide in small logits


@pytest.mark.parametrize("family", TRANSFORMERS_FAMILIES)
def test_imported_step_equals_parallel_and_cached_generation_equals_uncached(family):
    model = Seq2Seq.from_transformers(tiny_transformers_model(family))
    sources, mask, targets = padded_pair(model.config)
    with torch.no_grad():
        parallel = model(sources, targets, mask)
    state = model.start(sources, mask, max_steps=targets.shape[1])
    stepped = torch.stack([model.step(targets[:, t], state) for t in range(targets.shape[1])], dim=1)
    torch.testing.assert_close(stepped, parallel, atol=1e-5, rtol=0)
    cached = model.generate(sources, mask, max_new_tokens=8)
    assert torch.equal(cached, model.generate(sources, mask, max_new_tokens=8, use_cache=False))


@pytest.mark.parametrize("family", TRANSFORMERS_FAMILIES)
def test_the_fast_path_decodes_an_imported_model_as_eager(family):
    model = Seq2Seq.from_transformers(tiny_transformers_model(family))
    sources, mask, _ = padded_pair(model.config)
    eager = model.generate(sources, mask, max_new_tokens=8)
    assert torch.equal(model.optimize_for_inference().generate(sources, mask, max_new_tokens=8), eager)


def banned_like_hybrid(config: ModelConfig) -> list[int]:
    """hybrid never generates padding or its decoder start id (unless it is EOS): the same ban, for transformers."""
    return sorted({config.pad_id, config.bos_id} - {config.eos_id})


@pytest.mark.parametrize("family", TRANSFORMERS_FAMILIES)
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_with_the_models_own_generation_config_equals_transformers(family, num_beams):
    hf_model = tiny_transformers_model(family)
    model = Seq2Seq.from_transformers(hf_model)
    assert model.generation_config == {key: value for key, value in {
        "forced_eos_token_id": hf_model.generation_config.forced_eos_token_id, "use_cache": True}.items()
        if value is not None}
    sources, mask, _ = padded_pair(model.config)
    expected = hf_model.generate(input_ids=sources, attention_mask=mask.long(), max_new_tokens=9,
                                 num_beams=num_beams, suppress_tokens=banned_like_hybrid(model.config))
    ours = model.generate(sources, mask, max_new_tokens=9, num_beams=num_beams)
    assert torch.equal(ours, expected[:, 1:])  # transformers' rows start with the decoder start id


@pytest.mark.parametrize("family", TRANSFORMERS_FAMILIES)
def test_export_loads_in_transformers_with_the_same_logits_and_reimports_bit_for_bit(family, tmp_path):
    hf_model = tiny_transformers_model(family)
    model = Seq2Seq.from_transformers(hf_model)
    model.generation_config["num_beams"] = 2  # the model's defaults travel with it
    save_transformers(model, tmp_path)
    exported = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    sources, mask, targets = padded_pair(model.config)
    assert torch.equal(transformers_logits(exported, sources, mask, targets),
                       transformers_logits(hf_model, sources, mask, targets))
    assert exported.generation_config.num_beams == 2
    again = Seq2Seq.from_transformers(tmp_path)
    assert again.config == model.config and again.generation_config == model.generation_config
    assert again.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(again.state_dict()[name], tensor) for name, tensor in model.state_dict().items())


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_ctranslate2_decodes_the_exported_folder_as_transformers_does(family, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    hf_model = tiny_transformers_model(family)
    tokenizer = tiny_transformers_tokenizer(hf_model)
    model = Seq2Seq.from_transformers(hf_model)
    save_transformers(model, tmp_path / "hf")
    tokenizer.save_pretrained(tmp_path / "hf")
    ctranslate2.converters.TransformersConverter(str(tmp_path / "hf")).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    sources, mask, _ = padded_pair(model.config)
    # Only the decoding rules both engines have: no forced EOS (CTranslate2 has none), padding banned.
    expected = hf_model.generate(input_ids=sources, attention_mask=mask.long(), max_new_tokens=8, num_beams=1,
                                 forced_eos_token_id=None, forced_bos_token_id=None,
                                 suppress_tokens=banned_like_hybrid(model.config))
    tokens = [tokenizer.convert_ids_to_tokens(row[keep].tolist()) for row, keep in zip(sources, mask, strict=True)]
    results = translator.translate_batch(
        tokens, beam_size=1, max_decoding_length=8, suppress_sequences=[["<pad>"]] if family == "bart" else None)
    for result, row in zip(results, expected[:, 1:], strict=True):
        tokens = tokenizer.convert_ids_to_tokens([i for i in row.tolist() if i not in (model.config.pad_id,)])
        assert result.hypotheses[0] == [t for t in tokens if t != "</s>"]


def test_an_unsupported_class_is_refused_by_name_with_the_supported_list():
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4))
    with pytest.raises(ValueError, match="T5ForConditionalGeneration.*not supported yet.*BART.*Marian.*M2M100"):
        Seq2Seq.from_transformers(t5)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(ValueError, match="cannot import GPT2LMHeadModel.*BART.*Marian.*mBART.*M2M100"):
        Seq2Seq.from_transformers(gpt2)


def test_a_folder_without_weights_or_config_is_refused_in_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        Seq2Seq.from_transformers(tmp_path)
    tiny_transformers_model("marian").config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="MarianMTModel config but no weights"):
        Seq2Seq.from_transformers(tmp_path)


def test_a_decoder_with_other_mixers_or_hybrids_own_architecture_does_not_export(tmp_path):
    from hybrid.convert import convert

    model = Seq2Seq.from_transformers(tiny_transformers_model("bart"))
    lstm, _ = convert(model, "lstm")
    with pytest.raises(ValueError, match="only a decoder of attention mixers exports to transformers.*lstm"):
        save_transformers(lstm, tmp_path)
    native = Seq2Seq(ModelConfig(vocab_size=16, d_model=16, n_heads=2, d_ff=32, decoder_mixers="attention"))
    with pytest.raises(ValueError, match="rotary positions.*no transformers class"):
        save_transformers(native, tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_saved_imported_model_keeps_its_architecture_ids_and_generation_defaults(tmp_path):
    model = Seq2Seq.from_transformers(tiny_transformers_model("marian"))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "generation_config.json").read_text()) == model.generation_config
    loaded = Seq2Seq.from_pretrained(tmp_path)
    assert loaded.config == model.config and loaded.generation_config == model.generation_config
    assert (loaded.config.pad_id, loaded.config.bos_id) == (39, 39)  # Marian starts decoding from its pad id


def run_hybrid(*arguments, cwd):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "hybrid.cli", *arguments], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_hybrid_import_then_generate_decodes_text_as_transformers_and_export_refuses_an_lstm_decoder(tmp_path):
    hf_model = tiny_transformers_model("marian")
    tokenizer = tiny_transformers_tokenizer(hf_model)
    hf_model.generation_config.num_beams = 2  # a default of the model's own, which hybrid generate must follow
    hf_model.save_pretrained(tmp_path / "marian")
    tokenizer.save_pretrained(tmp_path / "marian")
    imported = run_hybrid("import", "hf=marian", "output=imported", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert (tmp_path / "imported" / "tokenizer" / "tokenizer.json").is_file()
    lines = ["t5 t6 t7 t8", "t9 t10", "t11 t3 t3 t4 t20"]
    (tmp_path / "input.txt").write_text("\n".join(lines) + "\n")
    generated = run_hybrid("generate", "ckpt_path=imported", "input=input.txt", "output=output.txt",
                           "max_new_tokens=9", cwd=tmp_path)
    assert generated.returncode == 0, generated.stderr
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    expected = hf_model.generate(**batch, max_new_tokens=9)  # num_beams=2 and forced EOS from its own config
    assert (tmp_path / "output.txt").read_text().splitlines() == tokenizer.batch_decode(expected,
                                                                                         skip_special_tokens=True)
    exported = run_hybrid("export", "ckpt_path=imported", "output=exported", "format=transformers", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")(lines)["input_ids"] == \
        tokenizer(lines)["input_ids"]  # the imported tokenizer goes with the model
    converted = run_hybrid("convert", "ckpt_path=imported", "pattern=lstm", "output=lstm.ckpt", cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    refused = run_hybrid("export", "ckpt_path=lstm.ckpt", "output=back", "format=transformers", cwd=tmp_path)
    assert refused.returncode == 1
    assert "only a decoder of attention mixers exports to transformers" in refused.stderr
    assert not (tmp_path / "back").exists() or not any((tmp_path / "back").iterdir())


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_an_imported_model_converts_to_every_mixer_keeping_all_else_and_its_generation_defaults(mixer):
    from hybrid.convert import convert

    model = Seq2Seq.from_transformers(tiny_transformers_model("marian")).eval()
    converted, _ = convert(model, mixer)
    converted.eval()
    before, after = model.state_dict(), converted.state_dict()
    assert all(torch.equal(after[key], value) for key, value in before.items() if ".mixer." not in key)
    architecture = ("positions", "position_offset", "pre_norm", "activation", "embedding_scale", "bos_id", "pad_id")
    assert all(getattr(converted.config, name) == getattr(model.config, name) for name in architecture)
    assert converted.generation_config == model.generation_config
    src = torch.tensor([[5, 17, 9, 0], [8, 3, 0, model.config.pad_id]])
    tgt = torch.tensor([[model.config.bos_id, 4, 12, 6], [model.config.bos_id, 7, 7, 2]])
    with torch.no_grad():  # the converted model steps as it runs in parallel, under Marian's architecture
        state = converted.start(src, src != model.config.pad_id, max_steps=tgt.shape[1])
        stepped = torch.stack([converted.step(tgt[:, t], state) for t in range(tgt.shape[1])], dim=1)
        assert (stepped - converted(src, tgt, src != model.config.pad_id)).abs().max().item() <= 1e-4
