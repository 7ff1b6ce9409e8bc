"""Logits processors: reshape the next-token scores before a search strategy picks a token.

Every processor is a callable `(input_ids, scores) -> scores` with Hugging Face transformers' signature,
so theirs and ours mix freely in one `LogitsProcessorList`:

- `input_ids` (LongTensor [B, t]) are the decoder ids so far, starting with the BOS column, so t >= 1
  and t - 1 tokens have been generated;
- `scores` (FloatTensor [B, V]) are the next-token logits; they are never modified in place (a processor
  with nothing to do at this step returns them as they are).

Everything runs on the scores' device and is vectorised over the batch. `__call__` never reads a tensor
back to the host (no `.item()`, `.tolist()` or `if tensor:`), so decoding never waits on the device;
branches depend only on shapes. The few constant tensors a processor needs are built on first use
and cached per device, because copying a Python list to an accelerator synchronises with it.

Each processor declares, with transformers' class attribute `supports_continuous_batching`, whether it
can run where the rows of a batch sit at different positions (continuous refill): True when it reads
only the scores (and at most the newest column of `input_ids`), False when it reads a row's history.
"""

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from hybrid.validators import check_float, check_int, check_token_id, check_token_ids, check_token_sequences

LogitsProcessor = Callable[[Tensor, Tensor], Tensor]


class _TokenMask:
    """A [V] bool mask that is True at some fixed token ids, built once per (device, vocabulary size).

    Ids outside the vocabulary are simply absent from the mask, so one processor serves models with
    different vocabulary sizes.
    """

    def __init__(self, token_ids: Sequence[int]) -> None:
        self.token_ids = tuple(token_ids)
        self._masks: dict[tuple[torch.device, int], Tensor] = {}

    def __call__(self, vocab_size: int, device: torch.device) -> Tensor:
        key = (device, vocab_size)
        if key not in self._masks:
            token_ids = torch.tensor(self.token_ids, dtype=torch.long, device=device)
            self._masks[key] = torch.isin(torch.arange(vocab_size, device=device), token_ids)
        return self._masks[key]


def _scatter_mask(token_ids: Tensor, is_set: Tensor, vocab_size: int) -> Tensor:
    """Return a [B, V] bool mask that is True at `token_ids[b, j]` wherever `is_set[b, j]`.

    Entries that are not set (or lie outside the vocabulary) write into a spare column past the
    vocabulary, so every write is True and scatter's unspecified order for duplicate indices is harmless.
    """
    columns = torch.where(is_set & (token_ids < vocab_size), token_ids, vocab_size)  # (B, N)
    mask = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.bool, device=token_ids.device)
    return mask.scatter_(1, columns, True)[:, :vocab_size]  # (B, V)


class TemperatureLogitsWarper:
    """Divide the scores by a temperature: below 1 sharpens the distribution, above 1 flattens it.

    `temperature` must be a finite float > 0; greedy decoding is the search strategy's job, not a
    temperature of 0.
    """

    supports_continuous_batching = True

    def __init__(self, temperature: float) -> None:
        self.temperature = check_float("temperature", temperature, above=0)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return scores / self.temperature


class TopKLogitsWarper:
    """Keep the `top_k` highest scores of each row and set the rest to `filter_value`.

    Scores tied with the k-th highest are all kept, so a row may keep more than k tokens. At least
    `min_tokens_to_keep` tokens are kept, and never more than the vocabulary. `top_k` must be an
    int >= 1 (leave the warper out to disable it).
    """

    supports_continuous_batching = True

    def __init__(self, top_k: int, filter_value: float = -math.inf, min_tokens_to_keep: int = 1) -> None:
        self.top_k = check_int("top_k", top_k, at_least=1)
        self.filter_value = check_float("filter_value", filter_value, finite=False)
        self.min_tokens_to_keep = check_int("min_tokens_to_keep", min_tokens_to_keep, at_least=1)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        top_k = min(max(self.top_k, self.min_tokens_to_keep), scores.shape[-1])
        kth_highest = torch.topk(scores, top_k, dim=-1).values[:, -1:]  # (B, 1)
        return scores.masked_fill(scores < kth_highest, self.filter_value)


class TopPLogitsWarper:
    """Nucleus sampling: keep the smallest set of highest-scoring tokens whose probability reaches `top_p`.

    As in Hugging Face transformers, a token is removed when the probability of all tokens scoring at
    most as high is <= 1 - top_p. Unlike there, tokens with equal scores count together, so ties are kept
    or removed as a group and the result never depends on sort order (without ties the two agree). The
    `min_tokens_to_keep` highest tokens (and any tied with them) are always kept. `top_p` must be a
    float in (0, 1]; 1 removes only tokens of probability 0. Probabilities are computed in float32, even
    for half-precision scores.
    """

    supports_continuous_batching = True

    def __init__(self, top_p: float, filter_value: float = -math.inf, min_tokens_to_keep: int = 1) -> None:
        self.top_p = check_float("top_p", top_p, above=0, at_most=1)
        self.filter_value = check_float("filter_value", filter_value, finite=False)
        self.min_tokens_to_keep = check_int("min_tokens_to_keep", min_tokens_to_keep, at_least=1)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        sorted_scores, sorted_indices = torch.sort(scores, dim=-1)  # (B, V), ascending
        cumulative_probs = sorted_scores.softmax(dim=-1, dtype=torch.float32).cumsum(dim=-1)
        # Read each token's cumulative probability at the end of its run of ties: number the runs, find each
        # run's last position. (Not searchsorted, which ONNX lacks: the fast path runs this in its graph.)
        starts_run = torch.cat([torch.ones_like(sorted_scores[:, :1], dtype=torch.bool),
                                sorted_scores[:, 1:] != sorted_scores[:, :-1]], dim=-1)
        run = starts_run.long().cumsum(dim=-1) - 1  # (B, V)
        positions = torch.arange(scores.shape[-1], device=scores.device).expand_as(run)
        end_of_run = torch.zeros_like(run).scatter_reduce(-1, run, positions, "amax")
        mass_at_or_below = cumulative_probs.gather(-1, end_of_run.gather(-1, run))
        keep_count = min(self.min_tokens_to_keep, scores.shape[-1])
        lowest_kept = sorted_scores[:, -keep_count, None]  # (B, 1)
        sorted_to_remove = (mass_at_or_below <= 1 - self.top_p) & (sorted_scores < lowest_kept)
        to_remove = sorted_to_remove.scatter(-1, sorted_indices, sorted_to_remove)
        return scores.masked_fill(to_remove, self.filter_value)


class MinPLogitsWarper:
    """Remove tokens whose probability is below `min_p` times the probability of the most likely token.

    The cut-off scales with the model's confidence: strict when one token dominates, lenient when many
    are plausible. The `min_tokens_to_keep` highest tokens (and any tied with them) are always kept.
    `min_p` must be a float in [0, 1]; 0 keeps everything.
    """

    supports_continuous_batching = True

    def __init__(self, min_p: float, filter_value: float = -math.inf, min_tokens_to_keep: int = 1) -> None:
        self.min_p = check_float("min_p", min_p, at_least=0, at_most=1)
        self.filter_value = check_float("filter_value", filter_value, finite=False)
        self.min_tokens_to_keep = check_int("min_tokens_to_keep", min_tokens_to_keep, at_least=1)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        probs = scores.softmax(dim=-1, dtype=torch.float32)
        threshold = self.min_p * probs.max(dim=-1, keepdim=True).values  # (B, 1)
        keep_count = min(self.min_tokens_to_keep, scores.shape[-1])
        lowest_kept = torch.topk(scores, keep_count, dim=-1).values[:, -1:]  # (B, 1)
        to_remove = (probs < threshold) & (scores < lowest_kept)
        return scores.masked_fill(to_remove, self.filter_value)


class RepetitionPenaltyLogitsProcessor:
    """CTRL's repetition penalty: make every token already in `input_ids` less likely.

    A present token's score is multiplied by `penalty` when negative and divided by it otherwise, so a
    penalty > 1 always pushes it down. Like Hugging Face transformers, every column counts, the BOS
    column included; a token is penalised once however often it appears. `penalty` must be a finite
    float > 0.
    """

    supports_continuous_batching = False

    def __init__(self, penalty: float) -> None:
        self.penalty = check_float("penalty", penalty, above=0)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        present = scores.gather(1, input_ids)  # (B, t)
        penalised = torch.where(present < 0, present * self.penalty, present / self.penalty)
        # Repeated ids all write the same value, so scatter's write order does not matter.
        return scores.scatter(1, input_ids, penalised)


class NoRepeatNGramLogitsProcessor:
    """Ban every token that would complete an n-gram already present in `input_ids`.

    The last n - 1 tokens are compared with the first n - 1 tokens of every n-gram so far, and the last
    token of each match is banned; with n == 1 every token present is banned. The BOS column counts
    like any other. `ngram_size` must be an int >= 1.
    """

    supports_continuous_batching = False

    def __init__(self, ngram_size: int) -> None:
        self.ngram_size = check_int("ngram_size", ngram_size, at_least=1)

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        length, n = input_ids.shape[1], self.ngram_size
        if length < n:  # not one complete n-gram yet
            return scores
        ngrams = input_ids.unfold(1, n, 1)  # (B, t - n + 1, n)
        recent = input_ids[:, length - n + 1 :]  # (B, n - 1), the prefix the next token would extend
        matches = (ngrams[:, :, :-1] == recent[:, None, :]).all(dim=-1)  # (B, t - n + 1)
        banned = _scatter_mask(ngrams[:, :, -1], matches, scores.shape[-1])
        return scores.masked_fill(banned, -math.inf)


class NoBadWordsLogitsProcessor:
    """Ban token sequences: a bad word's last token is banned whenever the output ends with the rest.

    `bad_words_ids` is a non-empty list of non-empty lists of token ids. A one-token bad word is banned
    at every step. A longer one is banned once its prefix fits in `input_ids` (BOS column included) and
    matches the latest tokens. One-token bad words equal to an id in `eos_token_id` are dropped, as in
    Hugging Face transformers, so that generation can still stop. Ids outside the vocabulary are ignored.
    """

    def __init__(self, bad_words_ids: list[list[int]], eos_token_id: int | list[int] | None = None) -> None:
        bad_words = check_token_sequences("bad_words_ids", bad_words_ids)
        eos_ids = check_token_ids("eos_token_id", eos_token_id, optional=True) or ()
        self._single_tokens = _TokenMask(
            [word[0] for word in bad_words if len(word) == 1 and word[0] not in eos_ids]
        )
        # Bad words of one length are matched together, so the cost grows with the number of lengths.
        self._words_by_length: dict[int, list[tuple[int, ...]]] = {}
        for word in bad_words:
            if len(word) > 1:
                self._words_by_length.setdefault(len(word), []).append(word)
        self._word_tensors: dict[torch.device, list[tuple[Tensor, Tensor]]] = {}

    @property
    def reads_history(self) -> bool:
        """Whether a bad word is longer than one token: only then does a ban compare a row's latest tokens.
        Without, it is a fixed ban, which rows at any position and the fast path's graph apply alike."""
        return bool(self._words_by_length)

    @property
    def supports_continuous_batching(self) -> bool:
        """One-token bad words are banned everywhere; a longer one must compare a row's latest tokens."""
        return not self.reads_history

    def _prefixes_and_last_tokens(self, device: torch.device) -> list[tuple[Tensor, Tensor]]:
        """Per bad-word length, the prefixes (K, length - 1) and last tokens (K,) on `device`."""
        if device not in self._word_tensors:
            self._word_tensors[device] = [
                (
                    torch.tensor([word[:-1] for word in words], dtype=torch.long, device=device),
                    torch.tensor([word[-1] for word in words], dtype=torch.long, device=device),
                )
                for words in self._words_by_length.values()
            ]
        return self._word_tensors[device]

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        vocab_size = scores.shape[-1]
        banned = self._single_tokens(vocab_size, scores.device).expand_as(scores)  # (B, V)
        for prefixes, last_tokens in self._prefixes_and_last_tokens(scores.device):
            prefix_length = prefixes.shape[1]
            if prefix_length > input_ids.shape[1]:
                continue
            latest = input_ids[:, None, -prefix_length:]  # (B, 1, length - 1)
            matches = (latest == prefixes).all(dim=-1)  # (B, K)
            banned = banned | _scatter_mask(last_tokens.expand_as(matches), matches, vocab_size)
        return scores.masked_fill(banned, -math.inf)


class MinNewTokensLengthLogitsProcessor:
    """Forbid end-of-sequence until at least `min_new_tokens` tokens have been generated.

    The count of new tokens is `input_ids.shape[1] - prompt_length_to_skip`; an encoder-decoder passes
    prompt_length_to_skip=1 to skip the BOS column. `eos_token_id` is an id or a non-empty list of ids,
    all of which are banned.
    """

    supports_continuous_batching = False

    def __init__(
        self, prompt_length_to_skip: int, min_new_tokens: int, eos_token_id: int | list[int]
    ) -> None:
        self.prompt_length_to_skip = check_int("prompt_length_to_skip", prompt_length_to_skip, at_least=0)
        self.min_new_tokens = check_int("min_new_tokens", min_new_tokens, at_least=0)
        self._eos_mask = _TokenMask(check_token_ids("eos_token_id", eos_token_id))

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        generated = input_ids.shape[1] - self.prompt_length_to_skip
        return ban_end_of_sequence_while_short(scores, generated, self.min_new_tokens, self._eos_mask)


def ban_end_of_sequence_while_short(scores: Tensor, generated: int | Tensor, min_new_tokens: int,
                                    eos_mask: _TokenMask) -> Tensor:
    """The minimum-length rule, written once: ban every EOS id in the rows that have ``generated`` fewer
    than ``min_new_tokens`` tokens. ``generated`` is one count for the batch or one per row (B,), for
    batches whose rows have different forced prefixes or sit at different positions."""
    if isinstance(generated, int):
        if generated >= min_new_tokens:
            return scores
        return scores.masked_fill(eos_mask(scores.shape[-1], scores.device), -math.inf)
    too_short = (generated < min_new_tokens)[:, None]  # (B, 1)
    return scores.masked_fill(eos_mask(scores.shape[-1], scores.device) & too_short, -math.inf)


class ForcedBOSTokenLogitsProcessor:
    """Force `bos_token_id` as the first generated token (mBART's and NLLB's target language, BART's `<s>`).

    At the step where `input_ids` holds the decoder start alone, every score becomes -inf but
    `bos_token_id`'s, which becomes 0; other steps are left alone.
    """

    supports_continuous_batching = False  # it counts the columns of input_ids

    def __init__(self, bos_token_id: int) -> None:
        self._forced = _TokenMask([check_token_id("bos_token_id", bos_token_id)])

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return force_tokens_where(scores, input_ids.shape[-1] == 1, self._forced)


class ForcedEOSTokenLogitsProcessor:
    """Force end-of-sequence as the last token: at the step that makes `input_ids` `max_length` long.

    At that step every score becomes -inf but those of `eos_token_id` (an id or a non-empty list of ids),
    which become 0. An encoder-decoder's `max_length` counts the decoder start: 1 + max_new_tokens.
    """

    supports_continuous_batching = False  # it counts the columns of input_ids

    def __init__(self, max_length: int, eos_token_id: int | list[int]) -> None:
        self.max_length = check_int("max_length", max_length, at_least=1)
        self._forced = _TokenMask(check_token_ids("eos_token_id", eos_token_id))

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return force_tokens_where(scores, input_ids.shape[-1] == self.max_length - 1, self._forced)


def force_tokens_where(scores: Tensor, rows: bool | Tensor, forced: _TokenMask) -> Tensor:
    """The forcing rule of the two processors above, written once: in ``rows`` (one bool for the batch, or
    one per row (B,) where rows' counts differ), every score becomes -inf but the ``forced`` ids', 0."""
    if rows is False:
        return scores
    vocab_size = scores.shape[-1]
    forced_scores = scores.new_full((vocab_size,), -math.inf).masked_fill(forced(vocab_size, scores.device), 0.0)
    if rows is True:
        return forced_scores.expand_as(scores).clone()
    return torch.where(rows[:, None], forced_scores, scores)


class SuppressTokensLogitsProcessor:
    """Ban some tokens at every step, e.g. padding or unknown-word tokens.

    `suppress_tokens` is an id or a non-empty list of ids; ids outside the vocabulary are ignored.
    """

    supports_continuous_batching = True

    def __init__(self, suppress_tokens: int | list[int]) -> None:
        self._mask = _TokenMask(check_token_ids("suppress_tokens", suppress_tokens))

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        return scores.masked_fill(self._mask(scores.shape[-1], scores.device), -math.inf)


class LogitsProcessorList(list[LogitsProcessor]):
    """A list of logits processors that is itself a processor: calling it applies each one in order.

    Order matters: put penalties and bans first and the sampling warpers (temperature, top-k, top-p,
    min-p) last, as Hugging Face transformers does.
    """

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        for processor in self:
            scores = processor(input_ids, scores)
        return scores

    @property
    def supports_continuous_batching(self) -> bool | None:
        """True if every member says so, False if one says it cannot, None (unknown) otherwise."""
        return continuous_batching_support(self)


def continuous_batching_support(rules: Sequence[object]) -> bool | None:
    """Whether a chain of processors or criteria can run on rows at different positions: each declares it."""
    flags = [getattr(rule, "supports_continuous_batching", None) for rule in rules]
    if False in flags:
        return False
    return True if all(flag is True for flag in flags) else None
