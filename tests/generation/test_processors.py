"""Each logits processor against a plain-Python reference, written for clarity rather than speed."""

import math
import random

import pytest
import torch

from hybrid.generation.processors import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

SEEDS = [0, 1, 2]
# (seed, batch, vocabulary): looped over inside each test, which keeps the test count and run time down.
CASES = [(seed, batch, vocab) for seed in SEEDS for batch, vocab in [(1, 1), (3, 7), (4, 50)]]


def random_scores(
    seed: int, batch: int, vocab: int, ties: bool = False, masked: bool = False
) -> torch.Tensor:
    """Random logits; `ties` rounds them so many are equal, `masked` sets some to -inf as a warper would."""
    generator = torch.Generator().manual_seed(seed)
    scores = 3 * torch.randn(batch, vocab, generator=generator)
    if ties:
        scores = (2 * scores).round() / 2
    if masked:
        filtered = torch.rand(batch, vocab, generator=generator) < 0.3
        filtered[:, 0] = False  # a row of only -inf has no distribution
        scores = scores.masked_fill(filtered, -math.inf)
    return scores


def random_ids(seed: int, batch: int, length: int, vocab: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=generator)


def id_set(token_ids: int | list[int] | None) -> set[int]:
    if token_ids is None:
        return set()
    return {token_ids} if isinstance(token_ids, int) else set(token_ids)


def softmax(row: list[float]) -> list[float]:
    highest = max(row)
    exps = [math.exp(score - highest) for score in row]
    total = sum(exps)
    return [e / total for e in exps]


def kth_highest(row: list[float], k: int) -> float:
    return sorted(row, reverse=True)[min(k, len(row)) - 1]


def apply_bans(scores: torch.Tensor, banned_per_row: list[set[int]]) -> torch.Tensor:
    rows = scores.tolist()
    for row, banned in zip(rows, banned_per_row, strict=True):
        for token in banned:
            if token < len(row):
                row[token] = -math.inf
    return torch.tensor(rows, dtype=scores.dtype)


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature(temperature: float) -> None:
    for seed, batch, vocab in CASES:
        scores = random_scores(seed, batch, vocab)
        expected = [[score / temperature for score in row] for row in scores.tolist()]
        actual = TemperatureLogitsWarper(temperature)(random_ids(seed, batch, 3, vocab), scores)
        torch.testing.assert_close(actual, torch.tensor(expected))


@pytest.mark.parametrize("top_k, min_tokens_to_keep", [(1, 1), (3, 1), (3, 5), (100, 1)])
@pytest.mark.parametrize("ties", [False, True])
def test_top_k(top_k: int, min_tokens_to_keep: int, ties: bool) -> None:
    warper = TopKLogitsWarper(top_k, filter_value=-1e4, min_tokens_to_keep=min_tokens_to_keep)
    for seed, batch, vocab in CASES:
        scores = random_scores(seed, batch, vocab, ties=ties)
        expected = []
        for row in scores.tolist():
            threshold = kth_highest(row, max(top_k, min_tokens_to_keep))
            expected.append([score if score >= threshold else -1e4 for score in row])
        assert torch.equal(warper(random_ids(seed, batch, 3, vocab), scores), torch.tensor(expected))


def reference_top_p(row: list[float], top_p: float, min_tokens_to_keep: int) -> list[float]:
    """Remove a token when the mass of all tokens scoring at most as high is <= 1 - top_p."""
    probs = softmax(row)
    always_kept = kth_highest(row, min_tokens_to_keep)
    kept = []
    for score in row:
        mass_at_or_below = sum(p for other, p in zip(row, probs, strict=True) if other <= score)
        removed = mass_at_or_below <= 1 - top_p and score < always_kept
        kept.append(-math.inf if removed else score)
    return kept


@pytest.mark.parametrize("top_p, min_tokens_to_keep", [(0.3, 1), (0.8, 1), (0.8, 4), (0.95, 1), (1.0, 1)])
@pytest.mark.parametrize("ties, masked", [(False, False), (True, False), (False, True)])
def test_top_p(top_p: float, min_tokens_to_keep: int, ties: bool, masked: bool) -> None:
    warper = TopPLogitsWarper(top_p, min_tokens_to_keep=min_tokens_to_keep)
    for seed, batch, vocab in CASES:
        scores = random_scores(seed, batch, vocab, ties=ties, masked=masked)
        expected = [reference_top_p(row, top_p, min_tokens_to_keep) for row in scores.tolist()]
        assert torch.equal(warper(random_ids(seed, batch, 3, vocab), scores), torch.tensor(expected))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_top_p_in_half_precision_keeps_ties_together(dtype: torch.dtype) -> None:
    scores = random_scores(0, 4, 50).to(dtype)  # rounding to 8 or 11 bits of mantissa leaves ties
    expected = [reference_top_p(row, 0.7, 1) for row in scores.tolist()]
    actual = TopPLogitsWarper(0.7)(random_ids(0, 4, 3, 50), scores)
    assert actual.dtype == dtype
    assert torch.equal(actual, torch.tensor(expected, dtype=dtype))


@pytest.mark.parametrize("min_p, min_tokens_to_keep", [(0.0, 1), (0.05, 1), (0.3, 1), (0.3, 3), (1.0, 1)])
@pytest.mark.parametrize("ties, masked", [(False, False), (True, False), (False, True)])
def test_min_p(min_p: float, min_tokens_to_keep: int, ties: bool, masked: bool) -> None:
    warper = MinPLogitsWarper(min_p, min_tokens_to_keep=min_tokens_to_keep)
    for seed, batch, vocab in CASES:
        scores = random_scores(seed, batch, vocab, ties=ties, masked=masked)
        expected = []
        for row in scores.tolist():
            probs = softmax(row)
            threshold, always_kept = min_p * max(probs), kth_highest(row, min_tokens_to_keep)
            expected.append(
                [
                    -math.inf if p < threshold and score < always_kept else score
                    for score, p in zip(row, probs, strict=True)
                ]
            )
        assert torch.equal(warper(random_ids(seed, batch, 3, vocab), scores), torch.tensor(expected))


@pytest.mark.parametrize("length", [1, 4, 12])
@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3])
def test_repetition_penalty(length: int, penalty: float) -> None:
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    for seed, batch, vocab in CASES:
        scores = random_scores(seed, batch, vocab)
        input_ids = random_ids(seed, batch, length, vocab)
        expected = scores.tolist()
        for row, ids in zip(expected, input_ids.tolist(), strict=True):
            for token in set(ids):  # once per token, however often it repeats
                row[token] = row[token] * penalty if row[token] < 0 else row[token] / penalty
        torch.testing.assert_close(processor(input_ids, scores), torch.tensor(expected))


def reference_no_repeat_ngram(ids: list[int], n: int) -> set[int]:
    """The tokens that would complete an n-gram already in `ids`, as Hugging Face transformers finds them."""
    following: dict[tuple[int, ...], set[int]] = {}
    for start in range(len(ids) - n + 1):
        following.setdefault(tuple(ids[start : start + n - 1]), set()).add(ids[start + n - 1])
    return following.get(tuple(ids[len(ids) - n + 1 :]), set())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("ngram_size", [1, 2, 3, 4])
def test_no_repeat_ngram(seed: int, ngram_size: int) -> None:
    batch, vocab = 5, 4  # a small vocabulary so that n-grams repeat
    processor = NoRepeatNGramLogitsProcessor(ngram_size)
    for length in range(1, 12):
        scores = random_scores(seed, batch, vocab)
        input_ids = random_ids(seed + length, batch, length, vocab)
        banned = [reference_no_repeat_ngram(ids, ngram_size) for ids in input_ids.tolist()]
        assert torch.equal(processor(input_ids, scores), apply_bans(scores, banned))


def test_no_repeat_ngram_by_hand() -> None:
    input_ids = torch.tensor([[0, 1, 2, 1], [0, 3, 3, 3]])
    actual = NoRepeatNGramLogitsProcessor(2)(input_ids, torch.zeros(2, 4))
    assert torch.isinf(actual).tolist() == [[False, False, True, False], [False, False, False, True]]


def reference_bad_words(ids: list[int], bad_words: list[list[int]], eos_ids: set[int]) -> set[int]:
    banned = set()
    for word in bad_words:
        prefix = word[:-1]
        if len(word) == 1 and word[0] in eos_ids:
            continue
        if len(prefix) <= len(ids) and ids[len(ids) - len(prefix) :] == prefix:
            banned.add(word[-1])
    return banned


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("eos_token_id", [None, 2, [2, 3]])
def test_no_bad_words(seed: int, eos_token_id: int | list[int] | None) -> None:
    batch, vocab = 6, 5
    rng = random.Random(seed)
    bad_words = [[rng.randrange(vocab) for _ in range(rng.randint(1, 4))] for _ in range(8)]
    bad_words += [[2], [9], [1, 9], [3, 3, 3]]  # an eos, ids outside the vocabulary, a repeat
    eos_ids = id_set(eos_token_id)
    processor = NoBadWordsLogitsProcessor(bad_words, eos_token_id=eos_token_id)
    for length in range(1, 7):
        scores = random_scores(seed, batch, vocab)
        input_ids = random_ids(seed + length, batch, length, vocab)
        banned = [reference_bad_words(ids, bad_words, eos_ids) for ids in input_ids.tolist()]
        assert torch.equal(processor(input_ids, scores), apply_bans(scores, banned))


def test_no_bad_words_by_hand() -> None:
    processor = NoBadWordsLogitsProcessor([[4], [1, 2], [0, 1, 3]], eos_token_id=4)
    input_ids = torch.tensor([[0, 1], [2, 1], [3, 3]])
    actual = processor(input_ids, torch.zeros(3, 5))
    assert torch.isinf(actual).tolist() == [
        [False, False, True, True, False],
        [False, False, True, False, False],
        [False, False, False, False, False],
    ]
    # With one token, the two-token prefix of [0, 1, 3] does not fit yet.
    assert not torch.isinf(processor(input_ids[:, :1], torch.zeros(3, 5))).any()


@pytest.mark.parametrize("prompt_length_to_skip", [0, 1, 3])
@pytest.mark.parametrize("min_new_tokens", [0, 1, 4])
@pytest.mark.parametrize("eos_token_id", [2, [0, 5], [6, 99]])
def test_min_new_tokens(
    prompt_length_to_skip: int, min_new_tokens: int, eos_token_id: int | list[int]
) -> None:
    batch, vocab = 3, 7
    eos_ids = id_set(eos_token_id)
    processor = MinNewTokensLengthLogitsProcessor(prompt_length_to_skip, min_new_tokens, eos_token_id)
    for length in range(1, 9):
        scores = random_scores(length, batch, vocab)
        banned = eos_ids if length - prompt_length_to_skip < min_new_tokens else set()
        expected = apply_bans(scores, [banned] * batch)
        assert torch.equal(processor(random_ids(length, batch, length, vocab), scores), expected)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("suppress_tokens", [0, [1, 3], [3, 3, 100]])
def test_suppress_tokens(seed: int, suppress_tokens: int | list[int]) -> None:
    scores = random_scores(seed, 3, 7)
    suppressed = id_set(suppress_tokens)
    actual = SuppressTokensLogitsProcessor(suppress_tokens)(random_ids(seed, 3, 2, 7), scores)
    assert torch.equal(actual, apply_bans(scores, [suppressed] * 3))


def test_processor_list_applies_in_order() -> None:
    scores, input_ids = random_scores(0, 4, 50), random_ids(0, 4, 6, 50)
    penalty, temperature, top_k = (
        RepetitionPenaltyLogitsProcessor(1.5),
        TemperatureLogitsWarper(0.5),
        TopKLogitsWarper(5),
    )
    expected = top_k(input_ids, temperature(input_ids, penalty(input_ids, scores)))
    assert torch.equal(LogitsProcessorList([penalty, temperature, top_k])(input_ids, scores), expected)
    assert torch.equal(LogitsProcessorList()(input_ids, scores), scores)


def test_processors_do_not_modify_their_input() -> None:
    scores, input_ids = random_scores(0, 4, 50), random_ids(0, 4, 6, 50)
    original = scores.clone()
    for processor in all_processors():
        processor(input_ids, scores)
    assert torch.equal(scores, original)


def all_processors() -> list:
    return [
        TemperatureLogitsWarper(0.7),
        TopKLogitsWarper(3),
        TopPLogitsWarper(0.9),
        MinPLogitsWarper(0.1),
        RepetitionPenaltyLogitsProcessor(1.3),
        NoRepeatNGramLogitsProcessor(2),
        NoBadWordsLogitsProcessor([[1], [2, 3], [4, 5, 6]], eos_token_id=1),
        MinNewTokensLengthLogitsProcessor(1, 50, [2, 3]),
        SuppressTokensLogitsProcessor([0]),
    ]


def test_processors_never_read_values_back_to_the_host() -> None:
    # Meta tensors have shapes but no data, so any .item(), .tolist() or `if tensor:` would raise.
    input_ids = torch.zeros(3, 6, dtype=torch.long, device="meta")
    scores = torch.zeros(3, 10, device="meta")
    for processor in all_processors():
        assert processor(input_ids, scores).shape == scores.shape


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_processors_do_not_synchronise_with_cuda() -> None:
    input_ids = random_ids(0, 4, 6, 50).cuda()
    scores = random_scores(0, 4, 50).cuda()
    processors = all_processors()
    for processor in processors:
        processor(input_ids, scores)  # builds the per-device caches, which may copy from the host
    torch.cuda.set_sync_debug_mode("error")
    try:
        for processor in processors:
            processor(input_ids, scores)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize(
    "make, argument",
    [
        (lambda: TemperatureLogitsWarper(0.0), "temperature"),
        (lambda: TemperatureLogitsWarper(-1), "temperature"),
        (lambda: TemperatureLogitsWarper(float("nan")), "temperature"),
        (lambda: TemperatureLogitsWarper("1"), "temperature"),
        (lambda: TopKLogitsWarper(0), "top_k"),
        (lambda: TopKLogitsWarper(2.5), "top_k"),
        (lambda: TopKLogitsWarper(True), "top_k"),
        (lambda: TopKLogitsWarper(3, min_tokens_to_keep=0), "min_tokens_to_keep"),
        (lambda: TopKLogitsWarper(3, filter_value=float("nan")), "filter_value"),
        (lambda: TopPLogitsWarper(0.0), "top_p"),
        (lambda: TopPLogitsWarper(1.1), "top_p"),
        (lambda: TopPLogitsWarper(0.5, min_tokens_to_keep=-1), "min_tokens_to_keep"),
        (lambda: MinPLogitsWarper(-0.1), "min_p"),
        (lambda: MinPLogitsWarper(1.5), "min_p"),
        (lambda: MinPLogitsWarper(0.1, min_tokens_to_keep=0), "min_tokens_to_keep"),
        (lambda: RepetitionPenaltyLogitsProcessor(0), "penalty"),
        (lambda: RepetitionPenaltyLogitsProcessor(float("inf")), "penalty"),
        (lambda: NoRepeatNGramLogitsProcessor(0), "ngram_size"),
        (lambda: NoRepeatNGramLogitsProcessor(2.0), "ngram_size"),
        (lambda: NoBadWordsLogitsProcessor([]), "bad_words_ids"),
        (lambda: NoBadWordsLogitsProcessor([[]]), "bad_words_ids"),
        (lambda: NoBadWordsLogitsProcessor([1, 2]), "bad_words_ids"),
        (lambda: NoBadWordsLogitsProcessor([[1, -2]]), "bad_words_ids"),
        (lambda: NoBadWordsLogitsProcessor([[1.0]]), "bad_words_ids"),
        (lambda: NoBadWordsLogitsProcessor([[1]], eos_token_id=-1), "eos_token_id"),
        (lambda: MinNewTokensLengthLogitsProcessor(-1, 1, 2), "prompt_length_to_skip"),
        (lambda: MinNewTokensLengthLogitsProcessor(1, -1, 2), "min_new_tokens"),
        (lambda: MinNewTokensLengthLogitsProcessor(1, 1, []), "eos_token_id"),
        (lambda: MinNewTokensLengthLogitsProcessor(1, 1, [2, None]), "eos_token_id"),
        (lambda: SuppressTokensLogitsProcessor([]), "suppress_tokens"),
        (lambda: SuppressTokensLogitsProcessor([-1]), "suppress_tokens"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(make, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        make()


def test_matches_transformers() -> None:
    logits_process = pytest.importorskip("transformers.generation.logits_process")
    scores = random_scores(0, 4, 50)  # no ties: sort order then cannot matter to transformers
    input_ids = random_ids(0, 4, 8, 8)  # ids from a few tokens, so that n-grams and bad words recur
    pairs = [
        (TemperatureLogitsWarper(0.7), logits_process.TemperatureLogitsWarper(0.7)),
        (TopKLogitsWarper(5), logits_process.TopKLogitsWarper(5)),
        (
            TopPLogitsWarper(0.8, min_tokens_to_keep=3),
            logits_process.TopPLogitsWarper(0.8, min_tokens_to_keep=3),
        ),
        (MinPLogitsWarper(0.05), logits_process.MinPLogitsWarper(0.05)),
        (RepetitionPenaltyLogitsProcessor(1.3), logits_process.RepetitionPenaltyLogitsProcessor(1.3)),
        (NoRepeatNGramLogitsProcessor(2), logits_process.NoRepeatNGramLogitsProcessor(2)),
        (
            NoBadWordsLogitsProcessor([[3], [7], [1, 2], [5, 6, 7]], eos_token_id=7),
            logits_process.NoBadWordsLogitsProcessor([[3], [7], [1, 2], [5, 6, 7]], eos_token_id=7),
        ),
        (
            MinNewTokensLengthLogitsProcessor(1, 20, [2, 3]),
            logits_process.MinNewTokensLengthLogitsProcessor(1, 20, [2, 3]),
        ),
        (SuppressTokensLogitsProcessor([0, 4]), logits_process.SuppressTokensLogitsProcessor([0, 4])),
    ]
    for ours, theirs in pairs:
        torch.testing.assert_close(
            ours(input_ids, scores), theirs(input_ids, scores), msg=type(ours).__name__
        )
