"""hybrid's generate() against transformers' generate() driving the very same logits.

A tiny ``Seq2Seq`` in float64 is wrapped as a transformers encoder-decoder whose forward returns
hybrid's own teacher-forced logits (transformers runs it with ``use_cache=False``, rerunning the
decoder over the prefix). Both libraries cast a step's logits to float32 before any processing,
so the two see the same numbers and only the decoding algorithms are compared: token for token
for greedy and beam search, by a two-sample chi-square for sampling.

Conventions normalised before comparing, each documented by its library:
- transformers' ``sequences`` of an encoder-decoder start with ``decoder_start_token_id``
  (``GenerationMixin._prepare_decoder_input_ids_for_generation``); hybrid returns the ids after
  BOS (its README, "Generation"). The start column is dropped from transformers' rows.
- After a row ends, both fill it with ``pad_token_id`` (transformers' beam search with
  ``pad_token_id or eos_token_id[0]``, so EOS for a pad id of 0: both are given ``pad_token_id=FILL``,
  a non-zero id, so that the fill never looks like a generated EOS). Trailing fill is stripped.
- hybrid never generates padding or BOS; transformers is given ``suppress_tokens`` of the model's
  padding, the fill and BOS, which is exactly that rule in its own terms. So a user's
  ``SuppressTokensLogitsProcessor`` takes the place of that ban in both, and padding and BOS come up.
- Lengths count generated tokens in both (min_new_tokens, max_new_tokens, the length penalty).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import MIXER_PATTERNS, padded_batch, pattern_id, tiny_model

transformers = pytest.importorskip("transformers")
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput  # noqa: E402

VOCAB = 32  # large enough that every kept beam candidate is a live one (see test_beam_search)
PAD, BOS, EOS = 0, 1, 2
FILL = 3  # the pad_token_id both libraries are given for the output
LENGTHS = [5, 3, 7, 4]


class _Config(transformers.PretrainedConfig):
    model_type = "hybrid-conformance"


class _Encoder(torch.nn.Module):
    main_input_name = "input_ids"

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids=None, attention_mask=None, **kwargs) -> BaseModelOutput:
        memory, _ = self.model.encode(input_ids, attention_mask.bool())
        return BaseModelOutput(last_hidden_state=memory)


class HybridForTransformers(transformers.PreTrainedModel, transformers.GenerationMixin):
    """A hybrid ``Seq2Seq`` as a transformers encoder-decoder: same encoder, same teacher-forced logits."""

    config_class = _Config
    main_input_name = "input_ids"

    def __init__(self, model, pad_token_id: int = FILL) -> None:
        config = _Config(vocab_size=model.config.vocab_size, is_encoder_decoder=True, pad_token_id=pad_token_id,
                         bos_token_id=model.config.bos_id, eos_token_id=model.config.eos_id,
                         decoder_start_token_id=model.config.bos_id)
        super().__init__(config)
        self.model = model
        self.encoder = _Encoder(model)

    def get_encoder(self) -> _Encoder:
        return self.encoder

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, encoder_outputs=None,
                **kwargs) -> Seq2SeqLMOutput:
        memory = encoder_outputs.last_hidden_state
        logits = self.model.decode(decoder_input_ids, memory, attention_mask.bool()[:, None, None, :])
        return Seq2SeqLMOutput(logits=logits)

    def prepare_inputs_for_generation(self, decoder_input_ids, encoder_outputs=None, attention_mask=None,
                                      **kwargs) -> dict:
        return dict(decoder_input_ids=decoder_input_ids, encoder_outputs=encoder_outputs,
                    attention_mask=attention_mask)


@pytest.fixture(scope="module", params=MIXER_PATTERNS, ids=pattern_id)
def models(request):
    model = tiny_model(request.param, seed=21, vocab_size=VOCAB).double()
    return model, HybridForTransformers(model).eval()


def ours(model, src, **options):
    """hybrid's generate(), filling finished rows with FILL like transformers is told to."""
    return model.generate(src, pad_token_id=FILL, **options)


def theirs(wrapped, src, **options):
    """transformers' generate() on the same sources, with hybrid's never-generated ids suppressed."""
    with torch.no_grad():
        return wrapped.generate(input_ids=src, attention_mask=src.ne(PAD), use_cache=False,
                                suppress_tokens=[PAD, BOS, FILL], **options)


def normalise(rows, fill: int = FILL) -> list[list[int]]:
    """Each row as a list with the trailing fill stripped."""
    out = []
    for row in rows.tolist():
        while row and row[-1] == fill:
            row.pop()
        out.append(row)
    return out


def compare(models, src, **options):
    model, wrapped = models
    reference = theirs(wrapped, src, max_new_tokens=12, **options)[:, 1:]  # drop the decoder start column
    assert normalise(ours(model, src, max_new_tokens=12, **options)) == normalise(reference)


def as_transformers(options: dict) -> dict:
    """The same options for transformers, whose generate() takes its processors and criteria as lists of its own."""
    lists = {"logits_processor": transformers.LogitsProcessorList,
             "stopping_criteria": transformers.StoppingCriteriaList}
    return {name: lists[name](value) if name in lists else value for name, value in options.items()}


def suppress_tokens_of_your_own() -> dict:
    """transformers' own SuppressTokensLogitsProcessor, which in both libraries takes the place of the built-in
    ban on padding and BOS. It bans every real token (and the fill), so the choice is padding, BOS or EOS: with
    a minimum length, padding and BOS must come up."""
    return dict(logits_processor=[transformers.SuppressTokensLogitsProcessor(list(range(FILL, VOCAB)))])


class StopOnToken(transformers.StoppingCriteria):
    """A transformers stopping criterion: done once the newest token is ``token``."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token


GREEDY_CASES = {
    "plain": dict(),
    "min_new_tokens": dict(min_new_tokens=6),
    "eos_list": dict(eos_token_id=[EOS, 7]),
    "repetition_penalty": dict(repetition_penalty=1.5),
    "reward_repetition": dict(repetition_penalty=0.7),
    "no_repeat_ngram": dict(no_repeat_ngram_size=2),
    "bad_words": dict(bad_words_ids=[[5], [9, 10], [EOS]]),
    "everything": dict(min_new_tokens=3, repetition_penalty=1.3, no_repeat_ngram_size=3, bad_words_ids=[[11]],
                       eos_token_id=[EOS, 7]),
}


@pytest.mark.parametrize("options", GREEDY_CASES.values(), ids=GREEDY_CASES.keys())
def test_greedy_on_a_padded_batch(models, options):
    compare(models, padded_batch(LENGTHS, vocab=VOCAB, seed=22), **options)


def transformers_processors():
    return [transformers.NoRepeatNGramLogitsProcessor(2), transformers.RepetitionPenaltyLogitsProcessor(1.4),
            transformers.MinLengthLogitsProcessor(6, EOS)]


def transformers_criteria():
    return [transformers.MaxLengthCriteria(max_length=9), StopOnToken(17)]


@pytest.mark.parametrize("num_beams", [1, 3])
def test_transformers_own_processors_and_stopping_criteria(models, num_beams):
    # Passed unchanged to both. In transformers a custom MaxLengthCriteria replaces the default one; in
    # hybrid it stops in addition to max_new_tokens; with max_length below the limit both stop there.
    model, wrapped = models
    src = padded_batch(LENGTHS, vocab=VOCAB, seed=23)
    mine = ours(model, src, max_new_tokens=12, num_beams=num_beams, logits_processor=transformers_processors(),
                stopping_criteria=transformers_criteria())
    reference = theirs(wrapped, src, max_new_tokens=12, num_beams=num_beams,
                       logits_processor=transformers.LogitsProcessorList(transformers_processors()),
                       stopping_criteria=transformers.StoppingCriteriaList(transformers_criteria()))
    assert normalise(mine) == normalise(reference[:, 1:])


@pytest.mark.parametrize("num_beams", [1, 2])
def test_a_forced_prefix_is_fed_not_generated(models, num_beams):
    # A criterion that fires on a token inside the prefix: transformers applies criteria to generated
    # tokens only, so the whole prefix is kept and decoding goes on after it. EOS inside the prefix too.
    model, wrapped = models
    src = padded_batch(LENGTHS, vocab=VOCAB, seed=24)
    prefix = torch.tensor([[BOS, 5, 6, EOS, 7]] * len(LENGTHS))
    for options in (dict(stopping_criteria=[StopOnToken(6)]), dict(min_new_tokens=4), dict(length_penalty=2.0),
                    dict(repetition_penalty=1.5, no_repeat_ngram_size=2)):
        mine = ours(model, src, max_new_tokens=8, num_beams=num_beams, decoder_input_ids=prefix, **options)
        reference = theirs(wrapped, src, max_new_tokens=8, num_beams=num_beams, decoder_input_ids=prefix,
                           **as_transformers(options))[:, 1:]
        assert normalise(mine) == normalise(reference), options


def test_forced_prefixes_of_different_lengths_row_by_row(models):
    # hybrid takes one right-padded prefix per row; transformers one prompt per call: compare row by row.
    model, wrapped = models
    src = padded_batch(LENGTHS, vocab=VOCAB, seed=25)
    prefix = torch.tensor([[BOS, 5, 6, 7], [BOS, 8, FILL, FILL], [BOS, FILL, FILL, FILL], [BOS, 4, 4, FILL]])
    mine = ours(model, src, max_new_tokens=8, decoder_input_ids=prefix, min_new_tokens=2)
    for row, length in enumerate(LENGTHS):
        forced = prefix[row:row + 1][:, :int(prefix[row].ne(FILL).sum())]
        reference = theirs(wrapped, src[row:row + 1, :length], max_new_tokens=8, decoder_input_ids=forced,
                           min_new_tokens=2)[:, 1:]
        assert normalise(mine[row:row + 1]) == normalise(reference)


# Two beams, as many as the tokens allowed before EOS, so every kept candidate is a live one (see VOCAB).
@pytest.mark.parametrize("strategy", [dict(), dict(num_beams=2, num_return_sequences=2)], ids=["greedy", "beam"])
def test_a_suppress_tokens_processor_of_your_own_lifts_the_ban_on_padding_and_bos(models, strategy):
    # transformers' rule for a processor of a built-in's type, here the built-in suppress_tokens.
    model, wrapped = models
    src = padded_batch(LENGTHS, vocab=VOCAB, seed=31)
    options = dict(min_new_tokens=3, **strategy, **suppress_tokens_of_your_own())
    mine = ours(model, src, max_new_tokens=12, return_dict=True, **options)
    reference = theirs(wrapped, src, max_new_tokens=12, return_dict_in_generate=True, output_scores=True,
                       **as_transformers(options))
    assert normalise(mine.sequences) == normalise(reference.sequences[:, 1:])
    assert set(mine.sequences[:, :3].flatten().tolist()) <= {PAD, BOS}  # the ban is lifted, in both
    if "num_beams" in strategy:
        assert torch.allclose(mine.sequences_scores, reference.sequences_scores, atol=1e-5)


BEAM_GRID = [dict(num_beams=beams, length_penalty=penalty, early_stopping=stopping, num_return_sequences=returned)
             for beams, returned in [(2, 1), (4, 2), (4, 4)]
             for penalty in [1.0, 0.0, -0.8, 2.0]
             for stopping in [True, False, "never"]]


@pytest.mark.parametrize("options", BEAM_GRID, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_beam_search_sequences_and_scores(models, options):
    model, wrapped = models
    src = padded_batch(LENGTHS, vocab=VOCAB, seed=26)
    mine = ours(model, src, max_new_tokens=10, return_dict=True, **options)
    reference = theirs(wrapped, src, max_new_tokens=10, return_dict_in_generate=True, output_scores=True,
                       **options)
    assert normalise(mine.sequences) == normalise(reference.sequences[:, 1:])
    assert torch.allclose(mine.sequences_scores, reference.sequences_scores, atol=1e-5)


BEAM_CASES = {
    "min_new_tokens": dict(min_new_tokens=5),  # EOS banned after log_softmax, as transformers does
    "eos_list": dict(eos_token_id=[EOS, 7, 9]),
    "penalties": dict(repetition_penalty=1.3, no_repeat_ngram_size=2, bad_words_ids=[[5], [6, 7]]),
    "criterion_for_some_beams": dict(stopping_criteria=[StopOnToken(13)]),  # finished like an EOS candidate
}


@pytest.mark.parametrize("options", BEAM_CASES.values(), ids=BEAM_CASES.keys())
def test_beam_search_rules(models, options):
    model, wrapped = models
    # One source per call: transformers stops a whole batch together when every candidate of every source
    # ends, where hybrid ends each source on its own (README, "Generation"), which a criterion can reach.
    for seed in range(3):
        src = padded_batch([6], vocab=VOCAB, seed=27 + seed)
        mine = ours(model, src, max_new_tokens=10, num_beams=3, num_return_sequences=3, return_dict=True,
                    **options)
        reference = theirs(wrapped, src, max_new_tokens=10, num_beams=3, num_return_sequences=3,
                           return_dict_in_generate=True, output_scores=True, **as_transformers(options))
        assert normalise(mine.sequences) == normalise(reference.sequences[:, 1:])
        assert torch.allclose(mine.sequences_scores, reference.sequences_scores, atol=1e-5)


SAMPLING_CASES = {
    "plain": dict(top_k=0),
    "temperature_top_k": dict(temperature=0.7, top_k=5),
    "top_p": dict(top_p=0.8, top_k=0),
    "min_p": dict(min_p=0.15, top_k=0),
    "everything": dict(temperature=1.3, top_k=12, top_p=0.9, repetition_penalty=1.4, no_repeat_ngram_size=2),
    "suppress_tokens_of_your_own": dict(top_k=0, **suppress_tokens_of_your_own()),
}


@pytest.mark.parametrize("options", SAMPLING_CASES.values(), ids=SAMPLING_CASES.keys())
def test_sampling_distributions(models, options):
    # The libraries draw from different generators, so compare what they draw: the first and the third
    # token (which depends on the first two through the decoder and the processors) of `draws` samples.
    model, wrapped = models
    src = padded_batch([6], vocab=VOCAB, seed=30)
    draws = 3000
    mine = ours(model, src, max_new_tokens=3, min_new_tokens=3, do_sample=True, num_return_sequences=draws,
                generator=torch.Generator().manual_seed(0), **options)
    torch.manual_seed(0)
    reference = theirs(wrapped, src, max_new_tokens=3, min_new_tokens=3, do_sample=True,
                       num_return_sequences=draws, **as_transformers(options))[:, 1:]
    for column in (0, 2):
        statistic, cells = two_sample_chi_square(mine[:, column], reference[:, column])
        # A chi-square of `cells - 1` degrees of freedom: mean k, variance 2k; six standard deviations.
        assert statistic <= cells - 1 + 6 * math.sqrt(2 * (cells - 1)), (column, statistic, cells)


def two_sample_chi_square(a, b) -> tuple[float, int]:
    """The chi-square statistic of two equal-size samples of token ids, and the number of cells."""
    counts_a = torch.bincount(a, minlength=VOCAB).double()
    counts_b = torch.bincount(b, minlength=VOCAB).double()
    seen = (counts_a + counts_b) > 0
    statistic = ((counts_a - counts_b)[seen] ** 2 / (counts_a + counts_b)[seen]).sum().item()
    return statistic, max(int(seen.sum()), 2)


# transformers' ForcedBOSTokenLogitsProcessor and ForcedEOSTokenLogitsProcessor, from the options of an imported
# model's generation config. max_new_tokens=8 makes the forced EOS the last token of rows still running there.
FORCED_CASES = {
    "forced_bos": dict(forced_bos_token_id=5),
    "forced_eos": dict(forced_eos_token_id=EOS),
    "forced_eos_not_an_eos": dict(forced_eos_token_id=9),  # the last token is 9; the row ends at the limit
    "forced_eos_list": dict(forced_eos_token_id=[EOS, 7], eos_token_id=[EOS, 7]),
    "both_over_the_minimum_length": dict(forced_bos_token_id=5, forced_eos_token_id=EOS, min_new_tokens=8),
}


@pytest.mark.parametrize("options", FORCED_CASES.values(), ids=FORCED_CASES.keys())
@pytest.mark.parametrize("strategy", [dict(), dict(num_beams=3, num_return_sequences=2)], ids=["greedy", "beam"])
def test_forced_bos_and_eos_tokens_and_scores(models, options, strategy):
    model, wrapped = models
    src = padded_batch(LENGTHS, vocab=VOCAB, seed=40)
    mine = ours(model, src, max_new_tokens=8, return_dict=True, **strategy, **options)
    reference = theirs(wrapped, src, max_new_tokens=8, return_dict_in_generate=True, output_scores=True,
                       **strategy, **options)
    assert normalise(mine.sequences) == normalise(reference.sequences[:, 1:])
    if "num_beams" in strategy:
        assert torch.allclose(mine.sequences_scores, reference.sequences_scores, atol=1e-5)
    else:  # each step's processed scores of the rows still running (hybrid's finished rows have left: -inf)
        for step_scores, reference_scores in zip(mine.scores, reference.scores, strict=False):
            running = step_scores.isfinite().any(dim=-1)
            assert torch.allclose(step_scores[running], reference_scores[running], atol=1e-5)


@pytest.mark.parametrize("num_beams", [1, 2])
def test_forced_bos_and_eos_after_a_forced_prefix(models, num_beams):
    # transformers forces BOS only where input_ids is the decoder start alone, and counts max_length after
    # the prompt: after a longer prefix no BOS is forced, and the forced EOS is the 8th token after it.
    model, wrapped = models
    src = padded_batch(LENGTHS, vocab=VOCAB, seed=41)
    prefix = torch.tensor([[BOS, 5, 6]] * len(LENGTHS))
    options = dict(forced_bos_token_id=9, forced_eos_token_id=EOS, min_new_tokens=8)
    mine = ours(model, src, max_new_tokens=8, num_beams=num_beams, decoder_input_ids=prefix, **options)
    reference = theirs(wrapped, src, max_new_tokens=8, num_beams=num_beams, decoder_input_ids=prefix, **options)
    assert normalise(mine) == normalise(reference[:, 1:])
    assert (mine[:, 2] != 9).any() and (mine[:, 9] == EOS).all()


def test_a_forced_token_processor_of_your_own_takes_the_place_of_the_option(models):
    # transformers' merge rule: the user's forced EOS, which never fires within 8 tokens, replaces
    # forced_eos_token_id=9, so no row ends with 9. A user's minimum length leaves min_new_tokens standing, in
    # both: transformers enforces it twice (MinLengthLogitsProcessor too), and replaces only one of them.
    model, wrapped = models
    src = padded_batch(LENGTHS * 2, vocab=VOCAB, seed=42)
    yours = [transformers.ForcedEOSTokenLogitsProcessor(100, EOS),
             transformers.MinNewTokensLengthLogitsProcessor(1, 2, EOS)]
    options = dict(forced_eos_token_id=9, min_new_tokens=6, logits_processor=yours)
    mine = ours(model, src, max_new_tokens=8, **options)
    reference = theirs(wrapped, src, max_new_tokens=8, **as_transformers(options))
    assert normalise(mine) == normalise(reference[:, 1:])
    assert (mine[:, 7] != 9).any()


# The special ids of imported families: (pad_id, bos_id = the decoder start, eos_id) and generation options of
# their generation configs. The source's padding is the model's, so source ids avoid every special id.
FAMILIES = {
    "marian": (dict(pad_id=VOCAB - 1, bos_id=VOCAB - 1, eos_id=0), dict(forced_eos_token_id=0)),  # start = pad
    "t5": (dict(pad_id=0, bos_id=0, eos_id=1), dict()),  # start = pad
    "bart": (dict(pad_id=1, bos_id=2, eos_id=2), dict(forced_bos_token_id=0, forced_eos_token_id=2)),  # start = EOS
}


@pytest.mark.parametrize("strategy", [dict(), dict(num_beams=3, num_return_sequences=3)], ids=["greedy", "beam"])
@pytest.mark.parametrize("family", FAMILIES)
def test_an_imported_familys_ids_and_generation_options(family, strategy):
    # hybrid never generates the padding and the decoder start, less the EOS ids: transformers is given that
    # as suppress_tokens. The output's fill is the model's padding in both.
    ids, options = FAMILIES[family]
    model = tiny_model(["lstm", "attention"], seed=43, vocab_size=VOCAB, **ids).double()
    with torch.no_grad():  # the start, a likely token, shows that the ban holds and that EOS is never banned
        model.embed.weight[ids["bos_id"]] *= 2.0
    wrapped = HybridForTransformers(model, pad_token_id=ids["pad_id"]).eval()
    src = padded_batch(LENGTHS, vocab=VOCAB - 1, pad_id=ids["pad_id"], seed=44)  # ids 3 .. VOCAB - 2
    banned = sorted({ids["pad_id"], ids["bos_id"]} - {ids["eos_id"]})
    for row in range(2):  # one source per call in beam search (transformers stops a batch together)
        rows = src if not strategy else src[row:row + 1, :LENGTHS[row]]
        mine = model.generate(rows, max_new_tokens=8, return_dict=True, **strategy, **options)
        with torch.no_grad():
            reference = wrapped.generate(input_ids=rows, attention_mask=rows.ne(ids["pad_id"]), use_cache=False,
                                         suppress_tokens=banned, max_new_tokens=8, return_dict_in_generate=True,
                                         output_scores=True, **strategy, **options)
        assert normalise(mine.sequences, ids["pad_id"]) == normalise(reference.sequences[:, 1:], ids["pad_id"])
        if strategy:
            assert torch.allclose(mine.sequences_scores, reference.sequences_scores, atol=1e-5)
