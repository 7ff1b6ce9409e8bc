"""Bulk decoding: bucketing by a token budget, and continuous refill that decodes each source as alone."""

import random

import pytest
import torch
from conftest import TRANSFORMERS_FAMILIES, family_architecture, tiny_model

from hybrid import MIXERS
from hybrid.generation import EosTokenCriteria, SuppressTokensLogitsProcessor
from hybrid.generation.refill import RefillDecoder, Source, bucketed_batches


def random_sources(count: int, seed: int = 0) -> list[Source]:
    rng = random.Random(seed)
    return [Source(i, [rng.randrange(3, 13) for _ in range(rng.randint(1, 9))]) for i in range(count)]


def test_bucketing_sorts_within_windows_and_respects_the_token_budget():
    sources = random_sources(50)
    batches = list(bucketed_batches(sources, max_tokens=20, window=25))
    assert sorted(s.index for b in batches for s in b) == list(range(50))
    for batch in batches:
        assert len(batch) * max(len(s.ids) for s in batch) <= 20 or len(batch) == 1
        lengths = [len(s.ids) for s in batch]
        assert lengths == sorted(lengths)
    windows = [{s.index // 25 for s in batch} for batch in batches]
    assert all(len(w) == 1 for w in windows)  # no batch mixes two read-ahead windows
    assert [w.pop() for w in windows] == sorted(w for w in [min(s.index // 25 for s in b) for b in batches])


def test_bucketing_rejects_a_bad_budget():
    with pytest.raises(ValueError, match="max_tokens"):
        list(bucketed_batches(random_sources(3), max_tokens=0))


@pytest.mark.parametrize("bucketed, interval", [(True, 1), (False, 1), (True, 3)],
                         ids=["bucketed", "input-order", "checked-every-3-steps"])
@pytest.mark.parametrize("mixers, family", [([name, name], None) for name in sorted(MIXERS)] + [
    (["lstm", "attention"], None)] + [(sorted(MIXERS), family) for family in TRANSFORMERS_FAMILIES])
def test_refill_decodes_every_source_as_if_alone(mixers, family, bucketed, interval):
    # Input order mixes lengths in the slots, so the memory grows on refills and is trimmed on the way out.
    # Checking every 3 steps leaves finished rows (some at the length limit) stepping until the check.
    # The families' cases run every mixer in each imported family's architecture (positions, norms, ...).
    model = tiny_model(mixers, seed=3, **({} if family is None else family_architecture(family)))
    sources = random_sources(23, seed=4)
    decoder = RefillDecoder(model, slots=4, max_new_tokens=14, eos_check_interval=interval)
    batches = bucketed_batches(sources, max_tokens=40, window=10) if bucketed else [sources]
    results = dict(decoder.run(batches))
    assert sorted(results) == list(range(23))
    for source in sources:
        alone = model.generate(torch.tensor([source.ids]), max_new_tokens=14)[0]
        expected = alone[alone != model.config.pad_id].tolist()
        assert results[source.index] == expected, source.index


@pytest.mark.parametrize("options", [
    dict(pad_token_id=5), dict(min_new_tokens=6), dict(eos_token_id=[2, 7]), dict(bad_words_ids=[[5], [9]]),
    # A user's SuppressTokensLogitsProcessor replaces the built-in one that bans padding and BOS (transformers'
    # rule); this one names them, so they stay banned (the next test lifts the ban).
    dict(stopping_criteria=[EosTokenCriteria(8)]), dict(logits_processor=[SuppressTokensLogitsProcessor([0, 1, 4, 6])]),
], ids=["pad_token_id", "min_new_tokens", "eos_ids", "one-token-bad-words", "eos-criterion", "suppress"])
def test_refill_honours_every_rule_that_says_it_can(options):
    # Each of these rules declares supports_continuous_batching; refill must then give generate's answer.
    model = tiny_model(["lstm", "attention"], seed=6)
    sources = random_sources(13, seed=7)
    results = dict(RefillDecoder(model, slots=3, max_new_tokens=12, **options).run([sources]))
    for source in sources:
        alone = model.generate(torch.tensor([source.ids]), max_new_tokens=12, **options)[0]
        # One row alone is never padded: it ends at its EOS, or runs to the limit or a criterion.
        ends = [i for i, token in enumerate(alone.tolist()) if token in options.get("eos_token_id", [2])]
        expected = alone[:ends[0] + 1] if ends else alone
        assert results[source.index] == expected.tolist(), source.index


def test_refill_lets_your_own_suppress_tokens_lift_the_ban_on_padding_and_bos():
    # Every real token banned and EOS banned for two tokens: each row starts with padding or BOS, as in generate,
    # and a generated padding id neither ends the row nor is cut from it.
    model = tiny_model(["lstm", "attention"], seed=6)
    sources = random_sources(7, seed=8)
    options = dict(min_new_tokens=2, logits_processor=[SuppressTokensLogitsProcessor(list(range(3, 13)))])
    results = dict(RefillDecoder(model, slots=3, max_new_tokens=6, **options).run([sources]))
    for source in sources:
        alone = model.generate(torch.tensor([source.ids]), max_new_tokens=6, **options)[0].tolist()
        eos = model.config.eos_id
        assert results[source.index] == (alone[:alone.index(eos) + 1] if eos in alone else alone), source.index
        assert set(results[source.index][:2]) <= {model.config.pad_id, model.config.bos_id}


class CountsColumns:
    """A stopping criterion that reads the length of ``input_ids``, which refill's rows do not share."""

    supports_continuous_batching = False

    def __call__(self, input_ids, scores):
        return torch.full((input_ids.shape[0],), input_ids.shape[1] > 3)


@pytest.mark.parametrize("options, named", [
    (dict(num_beams=2), "num_beams"),
    (dict(do_sample=True, num_return_sequences=2), "num_return_sequences"),
    (dict(repetition_penalty=1.2), "repetition_penalty"),
    (dict(no_repeat_ngram_size=2), "no_repeat_ngram_size"),
    (dict(bad_words_ids=[[5, 6]]), "bad_words_ids"),
    (dict(logits_processor=[lambda input_ids, scores: scores]), "logits_processor"),
    (dict(stopping_criteria=[CountsColumns()]), "CountsColumns"),
    (dict(decoder_input_ids=torch.tensor([[1, 5]])), "decoder_input_ids"),
    (dict(use_cache=False), "use_cache"),
])
def test_refill_refuses_what_its_rules_say_it_cannot_honour(options, named):
    model = tiny_model(["lstm"])
    assert any(named in obstacle for obstacle in RefillDecoder.obstacles(model, **options))
    with pytest.raises(ValueError, match=f"refill cannot honour .*{named}"):
        RefillDecoder(model, slots=2, **options)


def test_refill_from_a_block_and_trimming_keep_every_row_exact():
    model = tiny_model(["lstm", "attention"], seed=5)
    long_src = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [4, 5, 6, 0, 0, 0, 0, 0]])
    state = model.start(long_src, max_steps=6)
    block = model.start(torch.tensor([[7, 8, 0, 0, 0, 0], [9, 10, 11, 12, 3, 4], [3, 4, 5, 0, 0, 0]]),
                        max_steps=1)  # only its memory is used
    bos = torch.full((2,), model.config.bos_id)
    model.step_unchecked(bos, state, torch.tensor([0, 0]))
    # Row 0 (the long source) leaves; block row 2 takes its slot; the memory shrinks to 3 positions.
    state.refill(torch.tensor([0]), block, torch.tensor([2]), source_length=3)
    assert state.memory_mask.shape[-1] == 3
    logits = model.step_unchecked(torch.tensor([model.config.bos_id, 9]), state, torch.tensor([0, 1]))
    alone = model.start(torch.tensor([[3, 4, 5]]), max_steps=2)
    assert (logits[0] - model.step(bos[:1], alone)[0]).abs().max().item() <= 1e-4
    other = model(long_src[1:, :3], torch.tensor([[model.config.bos_id, 9]]))[0, 1]
    assert (logits[1] - other).abs().max().item() <= 1e-4
    state.trim_source(3)  # nothing to trim: a no-op
    assert state.memory_mask.shape[-1] == 3


def test_refill_needs_one_fresh_row_per_slot():
    model = tiny_model(["lstm"], seed=5)
    state = model.start(torch.tensor([[5, 6], [7, 8]]), max_steps=2)
    with pytest.raises(ValueError, match="one fresh row per slot"):
        state.refill(torch.tensor([0, 1]), state, torch.tensor([0]))
