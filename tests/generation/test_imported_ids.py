"""Decoding follows the model's own ids and generation defaults, as an imported model needs.

The decoder start may be the padding id (Marian, T5) or the EOS id (BART, mBART, NLLB); forced BOS and EOS
tokens come from a model's generation config; ``model.generation_config`` holds defaults that the keyword
arguments override. Every path is checked: greedy, sampling, beam search, refill and the fast greedy graph.
"""

import copy

import pytest
import torch
from conftest import padded_batch, tiny_model

from hybrid.generation import GenerationConfig, generate
from hybrid.generation.refill import RefillDecoder, Source
from hybrid.generation.rules import DecodingRules

VOCAB = 24
FAMILIES = {  # pad_id, bos_id (the decoder start), eos_id
    "native": dict(pad_id=0, bos_id=1, eos_id=2),
    "marian": dict(pad_id=VOCAB - 1, bos_id=VOCAB - 1, eos_id=0),  # start = padding
    "t5": dict(pad_id=0, bos_id=0, eos_id=1),  # start = padding
    "bart": dict(pad_id=1, bos_id=2, eos_id=2),  # start = EOS
}
STRATEGIES = {"greedy": dict(), "sampling": dict(do_sample=True, top_k=0, num_return_sequences=2),
              "beam": dict(num_beams=3, num_return_sequences=2), "uncached": dict(use_cache=False)}


def family_model(family: str, mixers=("lstm", "attention")):
    """A tiny model with a family's ids, whose decoder start is a likely token, so the ban is put to work."""
    model = tiny_model(list(mixers), seed=5, vocab_size=VOCAB, **FAMILIES[family])
    with torch.no_grad():
        model.embed.weight[model.config.bos_id] *= 2.0
    return model


def family_sources(family: str, lengths=(5, 3, 6, 2), seed: int = 6) -> torch.Tensor:
    return padded_batch(list(lengths), vocab=VOCAB - 1, pad_id=FAMILIES[family]["pad_id"], seed=seed)  # ids 3..22


def run(model, src, **options):
    seeded = {"generator": torch.Generator().manual_seed(0)} if options.get("do_sample") else {}
    return generate(model, src, **options, **seeded)


@pytest.mark.parametrize("family, banned", [("native", [0, 1]), ("marian", [VOCAB - 1]), ("t5", [0]),
                                            ("bart", [1])])
def test_the_standing_ban_is_the_padding_and_the_decoder_start_less_the_eos_ids(family, banned):
    model = family_model(family)
    assert DecodingRules(GenerationConfig(), model.config).suppressed == banned


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
@pytest.mark.parametrize("family", FAMILIES)
def test_every_strategy_ends_rows_at_eos_and_never_generates_the_banned_ids(family, strategy):
    model = family_model(family)
    ids = FAMILIES[family]
    out = run(model, family_sources(family), max_new_tokens=10, min_new_tokens=2, **strategy)
    banned = {ids["pad_id"], ids["bos_id"]} - {ids["eos_id"]}
    for row in out.tolist():
        end = row.index(ids["eos_id"]) + 1 if ids["eos_id"] in row else len(row)
        assert end >= 2 and not banned & set(row[:end])  # a start equal to EOS ends no row before it is generated
        assert all(token == ids["pad_id"] for token in row[end:])


@pytest.mark.parametrize("family", ["marian", "t5", "bart"])
def test_a_forced_prefix_starts_with_a_decoder_start_that_is_padding_or_eos(family):
    # Column 0 is the start whatever id it shares: a start equal to the padding is no padding (the prefix
    # was refused as padded inside), and a start equal to EOS ends nothing.
    model = family_model(family)
    start, pad = FAMILIES[family]["bos_id"], FAMILIES[family]["pad_id"]
    src = family_sources(family)
    prefix = torch.tensor([[start, 5, 6], [start, 7, pad], [start, pad, pad], [start, 8, 9]])
    for strategy in (dict(), dict(num_beams=2)):
        out = run(model, src, max_new_tokens=6, decoder_input_ids=prefix, **strategy)
        assert out[:, :2].tolist()[0] == [5, 6] and out[1, 0] == 7 and out[3, :2].tolist() == [8, 9]
        alone = run(model, src[2:3], max_new_tokens=6, **strategy)
        assert out[2, :alone.shape[1]].tolist() == alone[0].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_refill_decodes_each_source_of_a_family_as_generate_does(family):
    model = family_model(family)
    options = dict(max_new_tokens=9, forced_eos_token_id=FAMILIES[family]["eos_id"], forced_bos_token_id=7)
    sources = [Source(i, row[row != FAMILIES[family]["pad_id"]].tolist())
               for i, row in enumerate(family_sources(family, lengths=(5, 3, 6, 2, 4, 1, 7), seed=8))]
    results = dict(RefillDecoder(model, slots=3, **options).run([sources]))
    for source in sources:
        alone = run(model, torch.tensor([source.ids]), **options)[0]
        assert results[source.index] == alone[alone != FAMILIES[family]["pad_id"]].tolist()
        assert results[source.index][0] == 7  # forced on each refilled row's first token


@pytest.mark.parametrize("strategy", STRATEGIES.values(), ids=STRATEGIES.keys())
def test_forced_bos_is_the_first_token_and_forced_eos_the_last_allowed_one(strategy):
    model = family_model("native")
    out = run(model, family_sources("native"), max_new_tokens=5, forced_bos_token_id=9, forced_eos_token_id=[2, 11],
              eos_token_id=[2, 11], min_new_tokens=5, **strategy)
    assert out.shape[1] == 5
    assert (out[:, 0] == 9).all() and torch.isin(out[:, 4], torch.tensor([2, 11])).all()
    assert not torch.isin(out[:, 1:4], torch.tensor([0, 1, 2, 11])).any()


def test_the_forced_eos_is_counted_per_row_after_its_forced_prefix():
    model = family_model("native")
    prefix = torch.tensor([[1, 5, 6, 7], [1, 8, 0, 0], [1, 0, 0, 0], [1, 4, 4, 0]])
    out = run(model, family_sources("native"), max_new_tokens=4, min_new_tokens=4, decoder_input_ids=prefix,
              forced_eos_token_id=2, forced_bos_token_id=9)
    for row, forced in enumerate([3, 1, 0, 2]):
        assert out[row, forced + 3] == 2  # the 4th generated token
        assert (out[row, forced] == 9) == (forced == 0)  # BOS is forced only right after the start


def test_decoder_start_token_id_overrides_the_models_start():
    model = family_model("native")
    restarted = copy.deepcopy(model)
    restarted.config.bos_id = 7
    src = family_sources("native")
    for strategy in (dict(), dict(num_beams=2)):
        assert torch.equal(run(model, src, max_new_tokens=8, decoder_start_token_id=7, **strategy),
                           run(restarted, src, max_new_tokens=8, **strategy))
    sources = [Source(i, row[row != 0].tolist()) for i, row in enumerate(src)]
    refilled = dict(RefillDecoder(model, slots=2, max_new_tokens=8, decoder_start_token_id=7).run([sources]))
    assert refilled == dict(RefillDecoder(restarted, slots=2, max_new_tokens=8).run([sources]))


@pytest.mark.parametrize("options, message", [
    (dict(forced_bos_token_id=0), r"forced_bos_token_id forces \[0\], which is padding or the decoder start"),
    (dict(forced_eos_token_id=[2, 1]), r"forced_eos_token_id forces \[1\]"),
    (dict(forced_bos_token_id=VOCAB), r"forced_bos_token_id must be an id in \[0, vocab_size=24\)"),
    (dict(forced_eos_token_id=[]), "forced_eos_token_id must be a token id"),
    (dict(decoder_start_token_id=-1), "decoder_start_token_id must be a token id"),
    (dict(decoder_start_token_id=VOCAB), r"decoder_start_token_id must be an id in \[0, vocab_size=24\)"),
])
def test_bad_forced_and_start_ids_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        run(family_model("native"), family_sources("native"), **options)


def test_refill_runs_forced_tokens_and_refuses_nothing_of_a_models_generation_config():
    model = family_model("marian")
    model.generation_config = {"forced_eos_token_id": 0, "bad_words_ids": [[VOCAB - 1]], "max_new_tokens": 7}
    assert RefillDecoder.obstacles(model) == []


def test_the_models_generation_defaults_apply_and_keyword_arguments_win():
    model, plain = family_model("bart"), family_model("bart")
    model.generation_config = {"num_beams": 3, "max_new_tokens": 4, "forced_bos_token_id": 0}
    src = family_sources("bart")
    assert torch.equal(generate(model, src), generate(plain, src, num_beams=3, max_new_tokens=4,
                                                      forced_bos_token_id=0))
    assert torch.equal(generate(model, src, num_beams=1, max_new_tokens=6),
                       generate(plain, src, max_new_tokens=6, forced_bos_token_id=0))
    sources = [Source(i, row[row != 1].tolist()) for i, row in enumerate(src)]
    refilled = dict(RefillDecoder(model, slots=2, num_beams=1).run([sources]))
    assert refilled == dict(RefillDecoder(plain, slots=2, max_new_tokens=4, forced_bos_token_id=0).run([sources]))


@pytest.mark.parametrize("defaults, message", [
    ({"num_beams": 2, "max_length": 20}, r"generation_config.json\) hold unknown options \['max_length'\]"),
    ({"logits_processor": []}, r"unknown options \['logits_processor'\]"),  # no file can hold a callable
    ({"num_beams": 0}, r"generation_config.json\) are invalid: num_beams must be a positive int, got 0"),
])
def test_bad_generation_defaults_are_refused_naming_the_file_and_the_option(defaults, message):
    model = family_model("native")
    model.generation_config = defaults
    with pytest.raises(ValueError, match=message):
        generate(model, family_sources("native"))
    with pytest.raises(ValueError, match=message):
        RefillDecoder(model, slots=2)


def test_the_fast_greedy_graph_runs_forced_tokens_and_keeps_one_graph_per_forced_id():
    # The forced ids are constants of the graph: a graph made for one forced EOS must not serve another.
    eager, fast = family_model("marian", ["lstm"]), family_model("marian", ["lstm"]).optimize_for_inference()
    src = family_sources("marian")
    for options in (dict(forced_eos_token_id=0), dict(forced_eos_token_id=9, forced_bos_token_id=5)):
        assert DecodingRules(GenerationConfig(**options), fast.config).runs_in_graph  # inside the graph
        for max_new_tokens in (3, 6):
            expected = generate(eager, src, max_new_tokens=max_new_tokens, min_new_tokens=3, **options)
            assert torch.equal(generate(fast, src, max_new_tokens=max_new_tokens, min_new_tokens=3, **options),
                               expected)
    assert len([key for key in fast.accelerator.sessions if isinstance(key, tuple)]) == 2


@pytest.mark.parametrize("refill", [True, False], ids=["refill", "batched"])
def test_a_bulk_job_starts_from_the_models_generation_defaults(refill):
    from hybrid.bulk import BulkJob, decode_shard, job_fingerprint
    from hybrid.tokenizer import Seq2SeqTokenizer

    alphabet = "abcdefghij"
    tokenizer = Seq2SeqTokenizer.train([alphabet], [alphabet])
    model = tiny_model(["lstm", "attention"], seed=9, vocab_size=tokenizer.vocab_size)
    plain = copy.deepcopy(model)
    model.generation_config = {"max_new_tokens": 3, "forced_bos_token_id": 5}
    texts = ["abc", "j", "hgfedcba", "ceg", "ii"]
    job = BulkJob.for_model(model, {"min_new_tokens": 1}, refill=refill, max_tokens=12)
    explicit = BulkJob.for_model(plain, {"min_new_tokens": 1, "max_new_tokens": 3, "forced_bos_token_id": 5},
                                 refill=refill, max_tokens=12)
    assert decode_shard(model, tokenizer, texts, job) == decode_shard(plain, tokenizer, texts, explicit)
    assert job_fingerprint(job, model, tokenizer, None) != job_fingerprint(job, plain, tokenizer, None)
