"""What decoding does with processors that misbehave and options that ban every token.

A processor that returns something other than the scores is refused by name. NaN scores count as
banned, and a row left with no allowed token ends with EOS, in greedy search, sampling and beam
search alike: the output never holds NaN, BOS or padding before an EOS, and the check reads
nothing back from the device.
"""

import pytest
import torch
from conftest import padded_batch, tiny_model
from torch.overrides import TorchFunctionMode

from hybrid.generation.rules import DecodingRules

STRATEGIES = {"greedy": {}, "sample": {"do_sample": True, "generator": torch.Generator().manual_seed(0)},
              "beam": {"num_beams": 3, "num_return_sequences": 2}}


@pytest.fixture(scope="module")
def model():
    return tiny_model(["lstm", "attention"], seed=3)


SOURCES = padded_batch([5, 2, 4], seed=3)


def _well_formed(model, out):
    """Each row: no BOS, no NaN, and padding only after the row's EOS."""
    eos, pad, bos = model.config.eos_id, model.config.pad_id, model.config.bos_id
    sequences = out.sequences
    assert not (sequences == bos).any()
    for row in sequences.tolist():
        end = row.index(eos) + 1 if eos in row else len(row)
        assert pad not in row[:end] and set(row[end:]) <= {pad}
    for name in ("scores", "sequences_scores"):
        value = getattr(out, name, None)
        tensors = value if isinstance(value, tuple) else [] if value is None else [value]
        assert not any(tensor.isnan().any() for tensor in tensors), name


@pytest.mark.parametrize("returned, error, message", [
    (lambda scores: None, TypeError, r"logits_processor \(broken\) returned NoneType"),
    (lambda scores: scores[:, :-1], ValueError, r"logits_processor \(broken\) returned .* shape \(3, 12\).*\(3, 13\)"),
    (lambda scores: scores.long(), ValueError, r"logits_processor \(broken\) returned a torch.int64 tensor"),
    (lambda scores: scores.tolist(), TypeError, r"returned list"),
])
def test_a_processor_that_returns_something_else_than_the_scores_is_refused_by_name(model, returned, error, message):
    def broken(input_ids, scores):
        return returned(scores)

    with pytest.raises(error, match=message):
        model.generate(SOURCES, max_new_tokens=5, logits_processor=[broken])


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("fill", [float("nan"), float("-inf")])
def test_a_processor_that_leaves_no_allowed_token_ends_the_row_with_eos(model, strategy, fill):
    def ban_everything_after_two_tokens(input_ids, scores):
        return scores.fill_(fill) if input_ids.shape[1] > 2 else scores

    out = model.generate(SOURCES, max_new_tokens=8, logits_processor=[ban_everything_after_two_tokens],
                         return_dict_in_generate=True, output_scores=True, **STRATEGIES[strategy])
    _well_formed(model, out)
    assert out.sequences.shape[1] <= 3  # two tokens, then EOS at the latest
    assert (out.sequences == model.config.eos_id).any(dim=1).all()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_options_that_ban_every_token_end_the_row_with_eos(model, strategy):
    eos = model.config.eos_id
    every_token = [[token] for token in range(3, model.config.vocab_size)]
    out = model.generate(SOURCES, max_new_tokens=6, min_new_tokens=3, bad_words_ids=every_token,
                         return_dict_in_generate=True, output_scores=True, **STRATEGIES[strategy])
    _well_formed(model, out)
    assert (out.sequences[:, 0] == eos).all()  # nothing is allowed while EOS is banned: EOS it is


def test_nan_and_infinite_scores_from_a_processor_never_reach_sampling(model):
    def some_nan_some_inf(input_ids, scores):
        scores = scores.clone()
        scores[:, 3] = float("nan")
        scores[0, 4] = float("inf")
        return scores

    out = model.generate(SOURCES, max_new_tokens=4, logits_processor=[some_nan_some_inf], do_sample=True,
                         generator=torch.Generator().manual_seed(1), return_dict_in_generate=True)
    assert (out.sequences[0, 0] == 4)  # +inf is the most likely, not a NaN probability
    assert not (out.sequences == 3).any()  # NaN is banned


class _NoHostReads(TorchFunctionMode):
    """Fails on any call that copies a tensor's value to the host."""

    READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
             torch.Tensor.__float__, torch.Tensor.nonzero, torch.Tensor.cpu, torch.Tensor.numpy}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.READS:
            raise AssertionError(f"{func.__name__} reads a value back to the host")
        return func(*args, **(kwargs or {}))


def test_the_checks_read_nothing_back_from_the_device(model):
    from hybrid.generation.config import GenerationConfig

    def ban_all(input_ids, scores):
        return torch.full_like(scores, float("nan"))

    rules = DecodingRules(GenerationConfig(max_new_tokens=4, logits_processor=[ban_all]), model.config)
    scores, input_ids = torch.randn(3, model.config.vocab_size), torch.ones(3, 2, dtype=torch.long)
    with _NoHostReads():
        processed = rules.process(input_ids, scores, torch.zeros(3, dtype=torch.long))
    assert processed.argmax(dim=-1).tolist() == [model.config.eos_id] * 3


def test_a_minimum_length_over_a_vocabulary_of_special_ids_is_refused():
    tiny = tiny_model(["lstm"], vocab_size=3)
    with pytest.raises(ValueError, match="min_new_tokens=2 leaves nothing to generate"):
        tiny.generate(torch.tensor([[1, 2]]), min_new_tokens=2, max_new_tokens=4)
