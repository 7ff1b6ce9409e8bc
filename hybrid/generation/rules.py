"""The decoding rules, each written once: what turns one step's logits into the next tokens.

Every decoding path builds one :class:`DecodingRules` from a :class:`GenerationConfig` and applies
it the same way: ``generate``'s greedy, sampling and beam search, continuous refill
(:mod:`hybrid.generation.refill`) and the accelerators' compiled steps (:mod:`hybrid.accel`).
The rules follow transformers' ``generate()`` wherever the option names are transformers':

- **The options** are the model's own generation defaults (``model.generation_config``, from its
  ``generation_config.json``) with ``generate()``'s keyword arguments laid over them: an option
  given always wins (:func:`hybrid.generation.config.with_model_defaults`).
- **The processor chain** runs in transformers' order (``GenerationMixin._get_logits_processor``):
  repetition penalty, no-repeat n-grams, bad words, the minimum length, the forced BOS, the forced
  EOS, the suppressed ids, the user's ``logits_processor`` (one of the same type as a built-in takes
  its place, as in ``_merge_criteria_processor_list``; transformers' own class of a built-in's name
  is its type), then, when sampling, temperature, top-k, top-p and min-p.
  Beam search runs it on log-probabilities, after ``log_softmax``, as transformers does.
- **The special ids are the model's.** A sequence starts from ``decoder_start_token_id`` (by default
  the model's ``bos_id``, transformers' ``decoder_start_token_id``); it may equal the padding id
  (Marian, T5) or an EOS id (BART, mBART, NLLB). The start is column 0, fed and never generated, so
  it is never taken for padding or for an end, whatever id it shares.
- **Padding and the decoder start are never generated, EOS ids excepted.** This is hybrid's one standing
  difference, and it is expressed as transformers would: as if ``suppress_tokens`` held the model's
  padding, ``pad_token_id`` and the decoder start, less every EOS id (so BART, whose start is its EOS,
  bans only its padding, and Marian, whose start is its padding, bans that one id). So, like that
  built-in, it gives way to a user's ``SuppressTokensLogitsProcessor``, hybrid's or transformers' own;
  then padding and the start are tokens like any other: a row ends only at EOS, ``max_new_tokens`` or
  a criterion, never at a generated padding id, and only the fill after its end is padding by
  position. A forced BOS or EOS that the ban would suppress is refused up front.
- **Forced BOS and EOS** (a model's ``generation_config``: mBART's and NLLB's target language, BART's
  ``<s>``, Marian's ``</s>``) with transformers' ``ForcedBOSTokenLogitsProcessor`` and
  ``ForcedEOSTokenLogitsProcessor``: ``forced_bos_token_id`` is the first generated token of a row
  whose forced prefix is the start alone; ``forced_eos_token_id`` (an id or a list) is the token a row
  generates after ``max_new_tokens - 1`` of its own, counted after its forced prefix. Both are generated
  tokens: they count towards the lengths and are scored 0 before the rest of the chain.
- **The minimum length** bans EOS until a row has generated ``min_new_tokens`` tokens, counted
  after its forced prefix (transformers' ``MinNewTokensLengthLogitsProcessor``), per row.
- **A forced prefix** (``decoder_input_ids``, right-padded, one per row) is fed, not generated:
  while a row is inside it the forced token is taken with log-probability 0, and EOS and the
  stopping criteria do not apply to it. A step where every row is forced skips the processor chain
  and the criteria altogether, so they first see a row after its prefix, as with transformers'
  prompt.
- **A sequence ends** with any id of ``eos_ids`` (transformers' ``EosTokenCriteria``, as its ``generate``
  adds it), at ``max_new_tokens`` generated tokens (each row's own count, which a criterion that counts
  the columns of ``input_ids`` cannot give where rows have forced prefixes or were refilled), or when a
  stopping criterion says so; criteria see only generated tokens (``input_ids`` ends with one).
- **A row left with no allowed token ends.** After a chain that can ban tokens at will (the user's
  processors, bad words, n-grams), a NaN score counts as banned, +inf as the largest float, and a
  row whose every score is -inf takes ``eos_ids[0]`` (score 0), so it ends there instead of
  sampling from NaN. All of it is tensor arithmetic on the device, with no host sync per step.
  Options that leave nothing to generate (a minimum length over a vocabulary of EOS, padding and
  the decoder start) are refused up front. A user
  processor must return a float tensor of the scores' shape; anything else is refused by name, and so
  is a stopping criterion's answer that is not a bool tensor of shape (rows,) or one bool for every row
  (:class:`~hybrid.generation.stopping.StoppingCriteriaList`). In beam search a slot of the pool that
  no hypothesis reached is returned as all padding, scored -inf.

Each rule declares whether continuous batching can honour it, with transformers' per-processor
flag ``supports_continuous_batching``: refill's rows sit at different positions, so it can run only
rules that read the scores, at most the newest column of ``input_ids`` and each row's own count of
generated tokens (the minimum length, the forced BOS and EOS). :meth:`DecodingRules.continuous_batching_obstacles`
is the one place that asks (through :func:`~hybrid.generation.processors.continuous_batching_support`),
for every processor and criterion and for what only ``generate``'s strategies do; refill and every
other caller ask it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from hybrid.generation.config import GenerationConfig
from hybrid.generation.processors import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    _TokenMask,
    ban_end_of_sequence_while_short,
    continuous_batching_support,
    force_tokens_where,
)
from hybrid.generation.stopping import EosTokenCriteria, StoppingCriteriaList
from hybrid.inputs import check_token_ids
from hybrid.validators import check_token_id

_SUPPRESSED = "padding and the decoder start, never generated"
_BAD_WORDS = "bad_words_ids"


@dataclass
class _Processor:
    """A processor with transformers' signature ``(input_ids, scores) -> scores`` in the chain."""

    processor: Callable[[Tensor, Tensor], Tensor]
    name: str  # the option it came from, for error messages

    @property
    def supports_continuous_batching(self) -> bool | None:
        return continuous_batching_support([self.processor])

    def __call__(self, input_ids: Tensor, scores: Tensor, generated: Tensor) -> Tensor:
        result = self.processor(input_ids, scores)
        # Shape and dtype are metadata: checking them reads nothing back from the device.
        if not isinstance(result, Tensor):
            raise TypeError(f"{self.name} returned {type(result).__name__}; a processor returns the scores, "
                            f"a float tensor of shape {tuple(scores.shape)}")
        if result.shape != scores.shape or not result.is_floating_point():
            raise ValueError(f"{self.name} returned a {result.dtype} tensor of shape {tuple(result.shape)}; "
                             f"a processor returns the scores, a float tensor of shape {tuple(scores.shape)}")
        return result


class _MinNewTokens:
    """``min_new_tokens`` over rows whose generated counts differ (forced prefixes, refilled rows)."""

    name = "min_new_tokens"
    # No user's processor takes its place: transformers enforces min_new_tokens twice (MinLengthLogitsProcessor
    # too), so one of either type leaves it standing.
    kind = None
    supports_continuous_batching = True  # each row's own count is known; its history is not needed

    def __init__(self, min_new_tokens: int | Tensor, eos_ids: list[int]) -> None:
        self.min_new_tokens = min_new_tokens
        self.eos_mask = _TokenMask(eos_ids)

    def __call__(self, input_ids: Tensor, scores: Tensor, generated: Tensor) -> Tensor:
        return ban_end_of_sequence_while_short(scores, generated, self.min_new_tokens, self.eos_mask)


class _ForcedBOS:
    """``forced_bos_token_id``: the first generated token of a row whose forced prefix is the decoder start
    alone, where transformers' processor sees an ``input_ids`` of one column. Wherever rows sit at
    different positions (refill, the fast path) ``input_ids`` is one column wide and nothing is forced, so
    a row's first token is the one it generates with none before it."""

    name = "forced_bos_token_id"
    kind = ForcedBOSTokenLogitsProcessor
    supports_continuous_batching = True

    def __init__(self, token_id: int) -> None:
        self.forced = _TokenMask([token_id])

    def __call__(self, input_ids: Tensor, scores: Tensor, generated: Tensor) -> Tensor:
        if input_ids.shape[1] > 1:  # every row is past its start
            return scores
        return force_tokens_where(scores, generated == 0, self.forced)


class _ForcedEOS:
    """``forced_eos_token_id``: the token a row generates last, when it has ``max_new_tokens - 1`` (its own
    count, after any forced prefix, as ``max_new_tokens`` counts)."""

    name = "forced_eos_token_id"
    kind = ForcedEOSTokenLogitsProcessor
    supports_continuous_batching = True

    def __init__(self, max_new_tokens: int | Tensor, token_ids: list[int]) -> None:
        self.max_new_tokens, self.token_ids = max_new_tokens, token_ids
        self.forced = _TokenMask(token_ids)

    def __call__(self, input_ids: Tensor, scores: Tensor, generated: Tensor) -> Tensor:
        return force_tokens_where(scores, generated == self.max_new_tokens - 1, self.forced)


# The built-in rules that read each row's generated count and fixed ids: with the standing ban alone they
# always leave EOS or a token allowed, and they need no history, so the fast path runs them in its graph.
_LENGTH_RULES = (_MinNewTokens, _ForcedBOS, _ForcedEOS)
# The built-in warpers, by option name: each reads only the scores and the option's own constant, so the
# fast path runs them in its graph too (a user's processor of their type stands under another name).
_WARPERS = ("temperature", "top_k", "top_p", "min_p")


class DecodingRules:
    """The rules of one ``generate`` call or bulk job, for a model with ``model_config``'s ids.

    ``process`` runs the processor chain; ``force`` applies a forced prefix; ``ends`` and
    ``stops`` say which rows are done; ``choose`` picks tokens (argmax, or a sample).
    ``min_new_tokens`` and ``max_new_tokens`` are the length limits, which an accelerator's compiled
    greedy advance takes as inputs (:meth:`with_length_limits`).
    """

    def __init__(self, config: GenerationConfig, model_config) -> None:
        self.config = config
        self.vocab_size = model_config.vocab_size
        self.bos_id = config.decoder_start_id(model_config)
        self.eos_ids = config.eos_ids(model_config)
        self.pad_id = _pad_id(config, model_config)
        self.forced_bos_id, self.forced_eos_ids = config.forced_ids(model_config)
        self.min_new_tokens, self.max_new_tokens = config.min_new_tokens, config.max_new_tokens
        self.end_of_sequence = EosTokenCriteria(self.eos_ids)
        # An id may be both the decoder start and padding (Marian, T5) or EOS (BART, mBART, NLLB): EOS is
        # never banned, so that a row can end.
        standing_ban = sorted({model_config.pad_id, self.pad_id, self.bos_id} - set(self.eos_ids))
        self.chain = _processor_chain(config, self.eos_ids, standing_ban, self.forced_bos_id, self.forced_eos_ids)
        # The ids never generated: none once a user's SuppressTokensLogitsProcessor took the ban's place.
        self.suppressed = standing_ban if any(rule.name == _SUPPRESSED for rule in self.chain) else []
        if config.min_new_tokens > 0 and not set(range(self.vocab_size)) - set(self.suppressed) - set(self.eos_ids):
            raise ValueError(f"min_new_tokens={config.min_new_tokens} leaves nothing to generate: the vocabulary "
                             f"({self.vocab_size} ids) holds only EOS {self.eos_ids} and the suppressed padding and "
                             f"decoder start {self.suppressed}")
        for name, ids in (("forced_bos_token_id", [self.forced_bos_id]), ("forced_eos_token_id", self.forced_eos_ids)):
            banned = sorted(set(ids or []) & set(self.suppressed))
            if banned:
                raise ValueError(f"{name} forces {banned}, which is padding or the decoder start, never generated "
                                 f"(suppressed: {self.suppressed}); force another id, or give a "
                                 "SuppressTokensLogitsProcessor of your own to take the place of that ban")
        # Only these rules ban by length and by fixed ids, which always leaves EOS or a token after it.
        self.can_ban_every_token = not all(isinstance(rule, _LENGTH_RULES) or rule.name == _SUPPRESSED
                                           for rule in self.chain)
        self.stopping = StoppingCriteriaList(config.stopping_criteria or [])
        self._end_rows: dict[tuple[torch.device, int], Tensor] = {}

    def process(self, input_ids: Tensor, scores: Tensor, generated: Tensor) -> Tensor:
        """The next-token scores (rows, vocab) after every processor, in transformers' order.

        ``input_ids`` (rows, t) are the decoder ids so far, BOS first; ``scores`` the float32 logits
        (log-probabilities in beam search); ``generated`` (rows,) how many tokens each row has
        generated before this step, forced prefix not counted.
        """
        for rule in self.chain:
            scores = rule(input_ids, scores, generated)
        if self.can_ban_every_token:
            scores = self._end_rows_with_no_allowed_token(scores)
        return scores

    def _end_rows_with_no_allowed_token(self, scores: Tensor) -> Tensor:
        """NaN -> -inf, +inf -> the largest float, and a row of nothing but -inf -> EOS at score 0."""
        scores = torch.where(scores.isnan(), float("-inf"), scores).clamp(max=torch.finfo(scores.dtype).max)
        key = (scores.device, scores.shape[-1])
        if key not in self._end_rows:
            end = torch.full((scores.shape[-1],), float("-inf"), device=scores.device)
            self._end_rows[key] = end.index_fill_(0, self.end_of_sequence.ids_on(scores.device)[:1], 0.0)
        no_allowed_token = (scores == float("-inf")).all(dim=-1, keepdim=True)  # (rows, 1)
        return torch.where(no_allowed_token, self._end_rows[key].to(scores.dtype), scores)

    def force(self, scores: Tensor, prefix: Tensor, prefix_lengths: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """Rows still inside their forced prefix take its token at column ``step + 1`` (score 0, the rest
        -inf); returns the scores and which rows (rows,) were forced."""
        column = step + 1
        forced = column < prefix_lengths  # (rows,)
        if column >= prefix.shape[1]:
            return scores, forced
        one_hot = torch.full_like(scores, float("-inf")).scatter_(1, prefix[:, column, None], 0.0)
        return torch.where(forced[:, None], one_hot, scores), forced

    def ends(self, tokens: Tensor, generated: Tensor) -> Tensor:
        """Rows that end with ``tokens``: an EOS id (:attr:`end_of_sequence`), or the ``generated`` count
        (these tokens included) reaching ``max_new_tokens``. Any shape; ``generated`` broadcasts against it."""
        return self.end_of_sequence.ends(tokens) | (generated >= self.max_new_tokens)

    def stops(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        """The user's stopping criteria (rows,) on ``input_ids`` that end with a generated token."""
        return self.stopping(input_ids, scores)

    def choose(self, scores: Tensor, noise: Tensor | None = None) -> Tensor:
        """The next token of each row (rows,): a draw from ``softmax(scores)`` or the argmax (greedy).

        A draw is ``torch.multinomial``'s, with ``generator``; given the ``noise`` that one would draw
        (:meth:`sampling_noise`, drawn before the step), it is computed from it as ``torch.multinomial``
        computes one sample: the argmax of the probabilities over the noise. That is how a compiled step
        samples (its graph takes the noise as an input) and still draws the very tokens of the eager step.
        """
        if not self.config.do_sample:
            return scores.argmax(dim=-1)
        probabilities = F.softmax(scores, dim=-1)
        if noise is None:
            return torch.multinomial(probabilities, 1, generator=self.config.generator).squeeze(1)
        return (probabilities / noise).argmax(dim=-1)

    def sampling_noise(self, out: Tensor) -> Tensor:
        """Fill ``out`` (rows, vocab) with what ``torch.multinomial(probabilities, 1, generator)`` draws for
        one sample of each row (an exponential variate per token, from ``config.generator``, or torch's
        default generator), advancing the generator as it would: :meth:`choose` turns it into the tokens."""
        return out.exponential_(1.0, generator=self.config.generator)

    def with_length_limits(self, min_new_tokens: int | Tensor, max_new_tokens: int | Tensor) -> DecodingRules:
        """These rules with other length limits, ints or 0-d tensors: the fast path exports the rules once
        with the limits as inputs of the graph, so one export serves every ``max_new_tokens``."""
        rules = copy.copy(self)
        rules.min_new_tokens, rules.max_new_tokens = min_new_tokens, max_new_tokens
        rules.chain = [_ForcedEOS(max_new_tokens, rule.token_ids) if isinstance(rule, _ForcedEOS) else rule
                       for rule in self.chain if not isinstance(rule, _MinNewTokens)]
        rules.chain.insert(self._min_length_slot(), _MinNewTokens(min_new_tokens, self.eos_ids))
        return rules

    def _min_length_slot(self) -> int:
        """Where the minimum-length rule stands in the chain: after the penalties and bans, before the rest."""
        for index, rule in enumerate(self.chain):
            if isinstance(rule, _LENGTH_RULES) or rule.name == _SUPPRESSED:
                return index
        return len(self.chain)

    @property
    def graph_signature(self) -> tuple:
        """Every constant that rules which run in a graph (:attr:`runs_in_graph`) depend on: the ids, when
        sampling the warpers' settings, and in beam search its own. The fast path's graph holds them as
        constants (the length limits and the sampling noise are its inputs), so a graph is made, and cached,
        once per value."""
        config = self.config
        sampling = (config.temperature, config.top_k, config.top_p, config.min_p) if config.do_sample else ()
        beams = (config.num_beams, config.length_penalty, config.early_stopping) if config.num_beams > 1 else ()
        bad_words = tuple(tuple(word) for word in config.bad_words_ids or ())
        return (tuple(self.suppressed), tuple(self.eos_ids), self.pad_id, self.forced_bos_id,
                tuple(self.forced_eos_ids or ()), bad_words, config.do_sample, *sampling, *beams)

    @property
    def runs_in_graph(self) -> bool:
        """True when every rule is the minimum length, a forced BOS or EOS, the suppressed ids, one-token bad
        words (a fixed ban: what an imported Marian's ``bad_words_ids=[[pad]]`` is) or a built-in warper
        (temperature, top-k, top-p, min-p), and no stopping criterion is given: then the rules read
        nothing but the newest scores, each row's count and the constants of :attr:`graph_signature`, and the
        fast path runs them, and the choice (greedy, or a draw from noise passed in), inside its graph."""
        return not self.stopping and all(isinstance(rule, _LENGTH_RULES) or rule.name in (_SUPPRESSED, *_WARPERS)
                                         or (rule.name == _BAD_WORDS and not rule.processor.reads_history)
                                         for rule in self.chain)

    def continuous_batching_obstacles(self) -> list[str]:
        """What of these options rows at different positions (continuous refill) cannot honour, by name; empty
        when refill can run them. Every processor and criterion says so itself (``supports_continuous_batching``);
        the rest is what only ``generate``'s strategies do."""
        config = self.config
        strategy = {"num_beams > 1 (beam search)": config.num_beams > 1,
                    "num_return_sequences > 1": config.num_return_sequences > 1,
                    "streamer": config.streamer is not None,
                    "return_dict_in_generate": config.return_dict_in_generate,
                    "use_cache=False": not config.use_cache,
                    "decoder_input_ids (a forced prefix per row)": config.decoder_input_ids is not None}
        obstacles = [name for name, present in strategy.items() if present]
        obstacles += [rule.name for rule in self.chain if continuous_batching_support([rule]) is not True]
        obstacles += [f"stopping_criteria ({type(criterion).__name__})" for criterion in self.stopping
                      if continuous_batching_support([criterion]) is not True]
        return obstacles

    def forced_prefix(self, sources: int, device: torch.device) -> tuple[Tensor, Tensor, int]:
        """The forced prefix of ``sources`` rows: (sources, P) ids that start with the decoder start,
        right-padded with ``pad_token_id`` after it; each row's length (sources,); and the first step at
        which some row is free."""
        bos = torch.full((sources, 1), self.bos_id, dtype=torch.long, device=device)
        decoder_input_ids = self.config.decoder_input_ids
        if decoder_input_ids is None:
            return bos, torch.ones(sources, dtype=torch.long, device=device), 0
        ids = check_token_ids("decoder_input_ids", decoder_input_ids, self.vocab_size, ndim=2).to(device)
        if ids.shape[0] != sources:
            raise ValueError(f"decoder_input_ids has {ids.shape[0]} rows but src_ids has {sources}")
        if not bool((ids[:, 0] == self.bos_id).all()):
            ids = torch.cat([bos, ids], dim=1)  # as in transformers, the decoder start token is prepended
        is_token = ids != self.pad_id
        is_token[:, 0] = True  # the decoder start, which may be the padding id (Marian, T5)
        lengths = is_token.sum(dim=1)
        expected = torch.arange(1, ids.shape[1] + 1, device=device).clamp(max=lengths[:, None])
        if bool((is_token.cumsum(dim=1) != expected).any()):
            raise ValueError("decoder_input_ids must be right-padded with pad_token_id (no padding inside a prefix)")
        return ids, lengths, int(lengths.min()) - 1


def _pad_id(config: GenerationConfig, model_config) -> int:
    if config.pad_token_id is None:
        return model_config.pad_id
    return check_token_id("pad_token_id", config.pad_token_id, vocab_size=model_config.vocab_size)


def _same_type(user: object, kind: type) -> bool:
    """Whether a user's processor is of a built-in's type, for transformers' merge rule. hybrid's built-ins are
    transformers' processors written again, so transformers' own class of the same name is the same type."""
    users_kind = type(user)
    return users_kind is kind or (users_kind.__name__ == kind.__name__
                                  and users_kind.__module__.startswith("transformers."))


def _kind(rule) -> type | None:
    """The processor type a built-in rule stands for, which a user's processor of that type replaces."""
    return type(rule.processor) if isinstance(rule, _Processor) else rule.kind


def _processor_chain(config: GenerationConfig, eos_ids: list[int], suppressed: list[int], forced_bos_id: int | None,
                     forced_eos_ids: list[int] | None) -> list:
    """The processors in transformers' order, with the user's merged in as transformers merges them."""
    built_in = []
    if config.repetition_penalty != 1.0:
        built_in.append(_Processor(RepetitionPenaltyLogitsProcessor(config.repetition_penalty), "repetition_penalty"))
    if config.no_repeat_ngram_size > 0:
        built_in.append(_Processor(NoRepeatNGramLogitsProcessor(config.no_repeat_ngram_size), "no_repeat_ngram_size"))
    if config.bad_words_ids:
        words = [list(word) for word in config.bad_words_ids]
        built_in.append(_Processor(NoBadWordsLogitsProcessor(words, eos_ids), _BAD_WORDS))
    if config.min_new_tokens > 0:
        built_in.append(_MinNewTokens(config.min_new_tokens, eos_ids))
    if forced_bos_id is not None:
        built_in.append(_ForcedBOS(forced_bos_id))
    if forced_eos_ids is not None:
        built_in.append(_ForcedEOS(config.max_new_tokens, forced_eos_ids))
    if suppressed:
        built_in.append(_Processor(SuppressTokensLogitsProcessor(suppressed), _SUPPRESSED))
    users = list(config.logits_processor or [])
    chain, used = [], []
    for rule in built_in:
        # transformers: a user's processor of the same type as a built-in one takes its place.
        kind = _kind(rule)
        replacement = None if kind is None else next((user for user in users if _same_type(user, kind)), None)
        if replacement is None:
            chain.append(rule)
        else:
            chain.append(_Processor(replacement, f"logits_processor ({type(replacement).__name__})"))
            used.append(replacement)
    chain += [_Processor(user, f"logits_processor ({getattr(user, '__name__', type(user).__name__)})")
              for user in users if not any(user is taken for taken in used)]
    if config.do_sample:
        if config.temperature != 1.0:
            chain.append(_Processor(TemperatureLogitsWarper(config.temperature), "temperature"))
        if config.top_k:
            chain.append(_Processor(TopKLogitsWarper(config.top_k), "top_k"))
        if config.top_p < 1.0:
            chain.append(_Processor(TopPLogitsWarper(config.top_p), "top_p"))
        if config.min_p:
            chain.append(_Processor(MinPLogitsWarper(config.min_p), "min_p"))
    return chain
