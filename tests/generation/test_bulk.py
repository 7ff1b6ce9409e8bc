"""Bulk decoding: bucketing by a token budget, and continuous refill that decodes each source as alone."""

import random

import pytest
import torch
from conftest import tiny_model

from hybrid import MIXERS
from hybrid.generation.bulk import RefillDecoder, Source, bucketed_batches


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
@pytest.mark.parametrize("mixers", [[name, name] for name in sorted(MIXERS)] + [["lstm", "attention"]])
def test_refill_decodes_every_source_as_if_alone(mixers, bucketed, interval):
    # Input order mixes lengths in the slots, so the memory grows on refills and is trimmed on the way out.
    # Checking every 3 steps leaves finished rows (some at the length limit) stepping until the check.
    model = tiny_model(mixers, seed=3)
    sources = random_sources(23, seed=4)
    decoder = RefillDecoder(model, slots=4, max_new_tokens=14, eos_check_interval=interval)
    batches = bucketed_batches(sources, max_tokens=40, window=10) if bucketed else [sources]
    results = dict(decoder.run(batches))
    assert sorted(results) == list(range(23))
    for source in sources:
        alone = model.generate(torch.tensor([source.ids]), max_new_tokens=14)[0]
        expected = alone[alone != model.config.pad_id].tolist()
        assert results[source.index] == expected, source.index


def test_refill_refuses_options_it_cannot_honour():
    with pytest.raises(ValueError, match=r"does not support \['num_beams'\]"):
        RefillDecoder(tiny_model(["lstm"]), slots=2, num_beams=2)


def test_refill_from_a_block_and_trimming_keep_every_row_exact():
    model = tiny_model(["lstm", "attention"], seed=5)
    long_src = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [4, 5, 6, 0, 0, 0, 0, 0]])
    state = model.start(long_src, max_new_tokens=6)
    block = model.start(torch.tensor([[7, 8, 0, 0, 0, 0], [9, 10, 11, 12, 3, 4], [3, 4, 5, 0, 0, 0]]),
                        max_new_tokens=1)  # only its memory is used
    bos = torch.full((2,), model.config.bos_id)
    model.step_unchecked(bos, state, torch.tensor([0, 0]))
    # Row 0 (the long source) leaves; block row 2 takes its slot; the memory shrinks to 3 positions.
    state.refill(torch.tensor([0]), block, torch.tensor([2]), source_length=3)
    assert state.memory_mask.shape[-1] == 3
    logits = model.step_unchecked(torch.tensor([model.config.bos_id, 9]), state, torch.tensor([0, 1]))
    alone = model.start(torch.tensor([[3, 4, 5]]), max_new_tokens=2)
    assert (logits[0] - model.step(bos[:1], alone)[0]).abs().max().item() <= 1e-4
    other = model(long_src[1:, :3], torch.tensor([[model.config.bos_id, 9]]))[0, 1]
    assert (logits[1] - other).abs().max().item() <= 1e-4
    state.trim_source(3)  # nothing to trim: a no-op
    assert state.memory_mask.shape[-1] == 3


def test_refill_needs_one_fresh_row_per_slot():
    model = tiny_model(["lstm"], seed=5)
    state = model.start(torch.tensor([[5, 6], [7, 8]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="one fresh row per slot"):
        state.refill(torch.tensor([0, 1]), state, torch.tensor([0]))
