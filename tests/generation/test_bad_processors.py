"""What decoding does with processors and stopping criteria that misbehave and options that ban every token.

A processor that returns something other than the scores, and a stopping criterion that answers
with something other than flags, are refused by name, in every decoding path. NaN scores count as
banned, and a row left with no allowed token ends with EOS, in greedy search, sampling and beam
search alike: the output never holds NaN, BOS or padding before an EOS (a beam-search slot that no
hypothesis reached is all padding, scored -inf), and the check reads nothing back from the device.
"""

import pytest
import torch
from conftest import padded_batch, tiny_model
from torch.overrides import TorchFunctionMode

from hybrid.generation import engine
from hybrid.generation.config import GenerationConfig
from hybrid.generation.refill import RefillDecoder, Source
from hybrid.generation.rules import DecodingRules
from hybrid.generation.sessions import StaticSession

STRATEGIES = {"greedy": {}, "sample": {"do_sample": True, "generator": torch.Generator().manual_seed(0)},
              "beam": {"num_beams": 3, "num_return_sequences": 2}}


@pytest.fixture(scope="module")
def model():
    return tiny_model(["lstm", "attention"], seed=3)


SOURCES = padded_batch([5, 2, 4], seed=3)


def _well_formed(model, out):
    """Each row: no BOS, no NaN, and padding only after the row's EOS, unless it is beam search's no-hypothesis
    row: all padding, scored -inf."""
    eos, pad, bos = model.config.eos_id, model.config.pad_id, model.config.bos_id
    sequences = out.sequences
    assert not (sequences == bos).any()
    for row, score in zip(sequences.tolist(), out.sequences_scores.tolist(), strict=True):
        if score == float("-inf") and out.beam_indices is not None:
            assert set(row) == {pad}
            continue
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


class _AnswersWith:
    """A stopping criterion that answers with ``answer(rows)`` and says refill can run it."""

    supports_continuous_batching = True

    def __init__(self, answer) -> None:
        self.answer = answer

    def __call__(self, input_ids, scores):
        return self.answer(input_ids.shape[0])


def _refill(model, **options):
    sources = [Source(index, ids) for index, ids in enumerate([[5, 6, 7], [8, 9], [4]])]
    return list(RefillDecoder(model, slots=2, **options).run([sources]))


def _static(model, **options):
    # What the CUDA-graph loop runs, uncaptured: the same decode over a batch that keeps every row.
    return engine.decode(model, SOURCES, None, GenerationConfig.from_kwargs(**options), StaticSession)


DECODERS = {**{name: lambda model, options=options, **more: model.generate(SOURCES, **options, **more)
               for name, options in STRATEGIES.items()},
            "refill": _refill, "cuda-graph-loop": _static}


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("answer, error, returned", [
    (lambda rows: None, TypeError, "NoneType"),
    (lambda rows: torch.ones(rows, 1, dtype=torch.bool), ValueError, r"a torch.bool tensor of shape \(\d+, 1\)"),
    (lambda rows: torch.ones(2 * rows, dtype=torch.bool), ValueError, r"a torch.bool tensor of shape \(\d+,\)"),
    (lambda rows: torch.ones(rows, dtype=torch.uint8), ValueError, r"a torch.uint8 tensor"),
], ids=["None", "2-D", "wrong-length", "uint8"])
def test_a_criterion_that_answers_with_something_else_than_flags_is_refused_by_name(model, decoder, answer, error,
                                                                                    returned):
    with pytest.raises(error, match=rf"stopping_criteria \(_AnswersWith\) returned {returned}.*; a stopping criterion "
                                    r"returns a bool tensor of shape \(\d+,\), one flag per row, or one flag for every "
                                    r"row: a Python bool or a 0-dim bool tensor"):
        DECODERS[decoder](model, max_new_tokens=5, stopping_criteria=[_AnswersWith(answer)])


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("answer", [True, torch.tensor(True)], ids=["bool", "0-dim-tensor"])
def test_a_criterion_may_answer_for_every_row_at_once(model, decoder, answer):
    out = DECODERS[decoder](model, max_new_tokens=5, stopping_criteria=[_AnswersWith(lambda rows: answer)])
    lengths = [len(ids) for _, ids in out] if decoder == "refill" else [out.shape[1]]
    assert lengths == [1] * len(lengths)  # every row stops after its first token


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
    hypotheses = out.sequences_scores.isfinite()  # beam search finds one; the other row is the no-hypothesis row
    assert (out.sequences[hypotheses, 0] == eos).all()  # nothing is allowed while EOS is banned: EOS it is
    assert hypotheses.view(len(SOURCES), -1)[:, 0].all()


def test_beam_search_with_nothing_allowed_ends_each_hypothesis_with_eos(mixer_pattern):
    # One real token beside padding, BOS and EOS: min_new_tokens bans EOS and the n-gram ban takes the token
    # once it is used, so after one token nothing is allowed. Each returned row is then a hypothesis ending
    # with EOS, never padding before it, or the no-hypothesis row: all padding, scored -inf.
    tiny = tiny_model(mixer_pattern, seed=3, vocab_size=4)
    eos, pad, token = tiny.config.eos_id, tiny.config.pad_id, 3
    out = tiny.generate(torch.tensor([[token, token], [token, pad]]), max_new_tokens=6, num_beams=3,
                        num_return_sequences=3, min_new_tokens=3, no_repeat_ngram_size=1, return_dict=True)
    assert out.sequences.tolist() == [[token, eos], [pad, pad], [pad, pad]] * 2
    assert out.sequences_scores.isfinite().tolist() == [True, False, False] * 2
    assert (out.beam_indices[~out.sequences_scores.isfinite()] == 0).all()


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
