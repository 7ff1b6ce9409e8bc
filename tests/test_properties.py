"""Property-based tests (hypothesis): random tiny configs, padded batches and generation arguments.

Each example knows whether its input is valid. A valid input must return a valid result and never
raise; an invalid one (a bad field or option, a target of the wrong shape, a source row of nothing but
padding) must raise the documented ``ValueError`` or ``TypeError``, naming what is wrong: never NaN,
never an IndexError or a RuntimeError from inside torch, never a hang (each example runs under an
alarm). A valid result here means: logits of the right shape with no NaN; generated ids inside the
vocabulary, no BOS, padding only after an EOS, the requested number of rows, no more new tokens than
asked for; scores without NaN. The examples are derandomized, so CI explores the same ones on every
run, and every value listed as invalid is also tried on its own, so none of them can be listed there
by mistake.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hybrid import MIXERS, ModelConfig, Seq2Seq

DOCUMENTED = (ValueError, TypeError)
SECONDS_PER_EXAMPLE = 30
PROPERTY_SETTINGS = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MIXER_NAMES = sorted(MIXERS)


@contextlib.contextmanager
def no_hang(seconds: int = SECONDS_PER_EXAMPLE):
    def fail(signum, frame):
        raise TimeoutError(f"the example ran for more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def valid_or_refused(call, invalid: list[str]):
    """Run ``call`` and return its result when ``invalid`` is empty: a valid input that raises anything
    fails the test. Otherwise ``invalid`` names what is wrong with the input, and ``call`` must raise a
    documented error whose message names one of those (the one checked first), and return None."""
    if not invalid:
        with no_hang():
            result = call()
        event("valid")
        return result
    with no_hang(), pytest.raises(DOCUMENTED) as refused:
        call()
    message = str(refused.value)
    assert any(name in message for name in invalid), f"the error names none of {invalid}: {message}"
    event("refused, as it should be")
    return None


# ----------------------------------------------------------------------------- configs

@st.composite
def valid_or_one_invalid(draw, valid: dict, invalid: dict, required: frozenset = frozenset()):
    """A dict of valid values for some of ``valid``'s keys (all of ``required``), and the list of the one
    key, if any, given a value of ``invalid``'s instead: an example tests at most one bad field, so its
    error must name that field."""
    fields = draw(st.fixed_dictionaries({key: valid[key] for key in valid if key in required},
                                        optional={key: valid[key] for key in valid if key not in required}))
    key = draw(st.one_of(st.none(), st.sampled_from(sorted(invalid))))
    if key is None:
        return fields, []
    fields[key] = draw(st.sampled_from(invalid[key]))
    return fields, [key]


def mixer_options(options: type) -> st.SearchStrategy:
    """Some of a mixer's options: each a small positive int, a small number for a float option, true or
    false for a flag (or None where the option allows it)."""
    def values(field: dataclasses.Field) -> st.SearchStrategy:
        kind = str(field.type)
        small = (st.booleans() if kind == "bool" else st.floats(-3.0, 3.0) if "float" in kind
                 else st.integers(1, 16))
        return st.one_of(st.none(), small) if "None" in str(field.type) else small
    return st.fixed_dictionaries({}, optional={field.name: values(field) for field in dataclasses.fields(options)})


VALID_CONFIG = {
    "vocab_size": st.integers(4, 24),
    "d_model": st.sampled_from([8, 12, 16]),
    "n_heads": st.sampled_from([1, 2]),
    "d_ff": st.integers(1, 32),
    "encoder_layers": st.integers(1, 2),
    "decoder_layers": st.just(2),
    "decoder_mixers": st.one_of(st.sampled_from(MIXER_NAMES),
                                st.lists(st.sampled_from(MIXER_NAMES), min_size=2, max_size=2)),
    "mixer_options": st.fixed_dictionaries({}, optional={name: mixer_options(MIXERS[name].Options)
                                                         for name in MIXER_NAMES}),
    "dropout": st.floats(0.0, 0.9),
    "max_positions": st.integers(8, 40),
    "layer_norm_eps": st.floats(1e-8, 1e-2),
    "tie_embeddings": st.booleans(),
}
# d_model 9 is bad for every drawn n_heads: odd head width at 1 head, not divisible at 2. A vocabulary of 2
# cannot hold the default eos_id, 2. pad_id 2 is the default eos_id.
INVALID_CONFIG = {
    "vocab_size": [0, -1, True, 2.5, "8", 2], "d_model": [0, 7.0, None, 9], "n_heads": [0, False, 2.0],
    "d_ff": [0, "64"], "encoder_layers": [0, -2], "decoder_layers": [0, 1.0],
    "decoder_mixers": [None, 5, [["lstm"]], "no-such-mixer", [], ["lstm", 3], ["lstm"] * 3],
    "mixer_options": [{"lstm": {"hidden_size": 0}}, {"lstm": {"hidden_size": 4.0}}, {"lstm": {"width": 3}},
                      {"t2r": {"feature_size": 0}}, {"lstm": {"forget_bias": "1"}}, {"gru": {"output_projection": 1}},
                      {"ssru": {"chunk_size": None}}, {"aan": {"ffn_size": -1}}, {"performer": {"redraw_interval": 0}},
                      {"no-such-mixer": {}}, {"lstm": 5}, []],
    "dropout": [-0.1, 1.0, math.nan, "x"], "max_positions": [0, 2.0],
    "layer_norm_eps": [-1.0, 0.0, math.nan, math.inf, "x"], "tie_embeddings": ["no", 1],
    "pad_id": [-1, 100, 2], "bos_id": [-1, 1.0], "eos_id": [0, 99], "extra": [[]],
}
# These four always drawn, so a default never builds a large model; the rest may take their defaults.
configs = valid_or_one_invalid(VALID_CONFIG, INVALID_CONFIG, frozenset({"vocab_size", "d_model", "n_heads",
                                                                        "decoder_layers"}))


@PROPERTY_SETTINGS
@given(drawn=configs, batch=st.integers(1, 3), source_length=st.integers(1, 8), target_length=st.integers(1, 8))
def test_any_config_builds_a_model_whose_logits_are_finite_or_is_refused(drawn, batch, source_length,
                                                                        target_length):
    fields, invalid = drawn
    def build_and_run():
        config = ModelConfig(**fields)
        torch.manual_seed(0)
        model = Seq2Seq(config).eval()
        src = torch.randint(3, config.vocab_size, (batch, source_length))  # no padding: every row has tokens
        tgt = torch.randint(0, config.vocab_size, (batch, target_length))
        with torch.no_grad():
            return config, model(src, tgt)

    result = valid_or_refused(build_and_run, invalid)
    if result is not None:
        config, logits = result
        assert logits.shape == (batch, target_length, config.vocab_size)
        assert not logits.isnan().any()


# The smallest model the drawn fields build: a bad value listed above must be refused in it too.
SMALL_CONFIG = {"vocab_size": 12, "d_model": 8, "n_heads": 2, "d_ff": 16, "encoder_layers": 1, "decoder_layers": 2}


@pytest.mark.parametrize("field, value", [(field, value) for field, values in INVALID_CONFIG.items()
                                          for value in values])
def test_every_value_listed_as_invalid_is_refused_naming_its_field(field, value):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**{**SMALL_CONFIG, field: value})


# ----------------------------------------------------------------------------- batches and generation

VOCAB, MAX_POSITIONS = 11, 24
_MODELS: dict[tuple[str, ...], Seq2Seq] = {}


def _model(pattern: tuple[str, ...]) -> Seq2Seq:
    if pattern not in _MODELS:
        torch.manual_seed(len(_MODELS))
        config = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=32, encoder_layers=1,
                             decoder_layers=len(pattern), decoder_mixers=list(pattern), dropout=0.0,
                             max_positions=MAX_POSITIONS)
        _MODELS[pattern] = Seq2Seq(config).eval()
    return _MODELS[pattern]


@st.composite
def padded_batches(draw):
    """Source ids with a mask whose padding may sit anywhere (left, right, holes, a whole row), of length
    1 up to the model's maximum."""
    rows = draw(st.integers(1, 4))
    length = draw(st.one_of(st.just(1), st.just(MAX_POSITIONS), st.integers(1, MAX_POSITIONS)))
    ids = torch.tensor(draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=length, max_size=length),
                                     min_size=rows, max_size=rows)))
    mask = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=length, max_size=length),
                                      min_size=rows, max_size=rows)))
    mask |= draw(st.booleans())  # often no padding at all
    if draw(st.integers(0, 9)) != 9:  # a row of nothing but padding (refused by name) only now and then
        first = draw(st.integers(0, length - 1))
        mask[~mask.any(dim=1), first] = True
    return ids, mask


def batch_defects(mask: torch.Tensor) -> list[str]:
    """What a refusal of this source batch names: its rows of nothing but padding, if any."""
    return ["are all padding"] if bool((~mask).all(dim=1).any()) else []


VALID_GENERATION = {
    "max_new_tokens": st.integers(1, 12),
    "min_new_tokens": st.integers(0, 6),  # kept to at most max_new_tokens, below
    "num_beams": st.integers(1, 4),
    "num_return_sequences": st.just(1),
    "do_sample": st.booleans(),
    "temperature": st.floats(0.05, 3.0),
    "top_k": st.integers(0, 15),
    "top_p": st.floats(0.01, 1.0),
    "min_p": st.floats(0.0, 1.0),
    "repetition_penalty": st.floats(0.1, 3.0),
    "no_repeat_ngram_size": st.integers(0, 3),
    "length_penalty": st.floats(-3.0, 3.0),
    "early_stopping": st.one_of(st.booleans(), st.just("never")),
    "eos_token_id": st.one_of(st.integers(2, VOCAB - 1), st.lists(st.integers(2, VOCAB - 1), min_size=1, max_size=3)),
    "bad_words_ids": st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=2), min_size=1, max_size=8),
    "use_cache": st.booleans(),
    "return_dict_in_generate": st.booleans(),
    "output_scores": st.booleans(),
}
INVALID_GENERATION = {
    "max_new_tokens": [0, -1, MAX_POSITIONS + 1, 10**6, 2.0, True], "min_new_tokens": [-1, "2"],
    "num_beams": [0, 1.5], "num_return_sequences": [0, -1], "do_sample": ["yes", 1],
    "temperature": [0.0, -1.0, math.nan, math.inf], "top_k": [-1, 2.5], "top_p": [0.0, 1.5, math.nan],
    "min_p": [-0.5, 2.0], "repetition_penalty": [0.0, -1.0, math.nan], "no_repeat_ngram_size": [-1],
    "length_penalty": [math.nan, math.inf, "1"], "early_stopping": ["sometimes"],
    "eos_token_id": [VOCAB, -1, True, 2.0, []], "pad_token_id": [VOCAB, -1],
    "bad_words_ids": [[], [[]], [3], "x"], "use_cache": ["no"], "return_dict_in_generate": ["no"],
}
generation_options = valid_or_one_invalid(VALID_GENERATION, INVALID_GENERATION)


def coherent(options: dict, invalid: list[str]) -> dict:
    """``options`` made coherent where they are valid, so that most examples decode and a bad option is refused
    for itself: a length the model holds, a minimum within it, no beam sampling (refused by name), and
    sampling where the temperature is bad (only sampling reads it, as in transformers)."""
    options.setdefault("max_new_tokens", 8)
    if isinstance(options.get("min_new_tokens"), int) and isinstance(options["max_new_tokens"], int):
        options["min_new_tokens"] = min(options["min_new_tokens"], max(options["max_new_tokens"], 0))
    if invalid == ["temperature"]:
        options.update(do_sample=True, num_beams=1)
    elif options.get("num_beams", 1) != 1 and invalid != ["do_sample"]:
        options["do_sample"] = False
    return options


@PROPERTY_SETTINGS
@given(pattern=st.lists(st.sampled_from(MIXER_NAMES), min_size=1, max_size=2).map(tuple), batch=padded_batches(),
       options=generation_options, seed=st.integers(0, 2**16))
def test_generate_returns_well_formed_rows_or_refuses_what_is_invalid(pattern, batch, options, seed):
    options, invalid = options
    options = coherent(options, invalid)
    model = _model(pattern)
    src_ids, src_mask = batch
    if options.get("do_sample") is True:
        options["generator"] = torch.Generator().manual_seed(seed)
    # A bad option is refused by name, unless the source is checked first and refused for its padding.
    out = valid_or_refused(lambda: model.generate(src_ids, src_mask, **options), invalid + batch_defects(src_mask))
    if out is None:
        return
    sequences = out.sequences if options.get("return_dict_in_generate") else out
    config = model.config
    pad = options.get("pad_token_id", config.pad_id)
    eos = options.get("eos_token_id", config.eos_id)
    eos_ids = set(eos) if isinstance(eos, list) else {eos}
    copies = options.get("num_return_sequences", 1)
    assert sequences.dtype == torch.long and sequences.shape[0] == src_ids.shape[0] * copies
    assert sequences.shape[1] <= options.get("max_new_tokens", 256)
    assert ((sequences >= 0) & (sequences < config.vocab_size)).all()
    assert not (sequences == config.bos_id).any() or config.bos_id in eos_ids
    for row in sequences.tolist():
        ends = [index for index, token in enumerate(row) if token in eos_ids]
        end = ends[0] + 1 if ends else len(row)
        if pad not in eos_ids:
            assert pad not in row[:end], f"padding before the end of {row}"
            assert set(row[end:]) <= {pad}, f"tokens after the end of {row}"
    if options.get("return_dict_in_generate"):
        for name in ("scores", "sequences_scores"):
            value = getattr(out, name, None)
            tensors = value if isinstance(value, tuple) else [] if value is None else [value]
            assert not any(tensor.isnan().any() for tensor in tensors), f"NaN in {name}"


@pytest.mark.parametrize("option, value", [(option, value) for option, values in INVALID_GENERATION.items()
                                           for value in values])
def test_every_option_listed_as_invalid_is_refused_naming_it(option, value):
    options = coherent({option: value}, [option])
    with pytest.raises(ValueError, match=option):
        _model(("lstm",)).generate(torch.tensor([[3, 4, 5]]), **options)


@PROPERTY_SETTINGS
@given(pattern=st.lists(st.sampled_from(MIXER_NAMES), min_size=1, max_size=2).map(tuple), batch=padded_batches(),
       target_length=st.one_of(st.just(1), st.just(MAX_POSITIONS), st.integers(1, MAX_POSITIONS + 2)),
       target_rows=st.one_of(st.none(), st.integers(1, 4)))
def test_forward_on_any_padded_batch_is_finite_or_refuses_what_is_invalid(pattern, batch, target_length,
                                                                          target_rows):
    model = _model(pattern)
    src_ids, src_mask = batch
    target_rows = src_ids.shape[0] if target_rows is None else target_rows  # mostly one per source
    tgt = torch.randint(0, VOCAB, (target_rows, target_length), generator=torch.Generator().manual_seed(0))
    invalid = batch_defects(src_mask)
    if target_rows != src_ids.shape[0]:
        invalid.append(f"tgt_ids has {target_rows} rows but src_ids has {src_ids.shape[0]}")
    if target_length > MAX_POSITIONS:
        invalid.append(f"target length must be in [1, max_positions={MAX_POSITIONS}], got {target_length}")
    with torch.no_grad():
        logits = valid_or_refused(lambda: model(src_ids, tgt, src_mask), invalid)
    if logits is not None:
        assert logits.shape == (target_rows, target_length, VOCAB) and not logits.isnan().any()


def test_a_source_of_only_padding_is_refused_by_row():
    """The one batch shape the strategies above meet only by chance: a row whose mask is all False."""
    model = _model(("lstm",))
    src_mask = torch.tensor([[True, True, True], [False, False, False]])
    with pytest.raises(ValueError, match=r"source rows \[1\] are all padding"):
        model.generate(torch.tensor([[3, 4, 5], [6, 7, 8]]), src_mask, max_new_tokens=5)
