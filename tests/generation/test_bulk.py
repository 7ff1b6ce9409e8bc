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


@pytest.mark.parametrize("mixers", [[name, name] for name in sorted(MIXERS)] + [["lstm", "attention"]])
def test_refill_decodes_every_source_as_if_alone(mixers):
    model = tiny_model(mixers, seed=3)
    sources = random_sources(23, seed=4)
    decoder = RefillDecoder(model, slots=4, max_new_tokens=14)
    results = dict(decoder.run(bucketed_batches(sources, max_tokens=40, window=10)))
    assert sorted(results) == list(range(23))
    for source in sources:
        alone = model.generate(torch.tensor([source.ids]), max_new_tokens=14)[0]
        expected = alone[alone != model.config.pad_id].tolist()
        assert results[source.index] == expected, source.index


def test_refill_refuses_options_it_cannot_honour():
    with pytest.raises(ValueError, match=r"does not support \['num_beams'\]"):
        RefillDecoder(tiny_model(["lstm"]), slots=2, num_beams=2)
