"""``generate``: greedy, sampling and beam search over any decoding state.

The strategies only talk to a session (``step``, ``reorder``, ``expand``), so they run
unchanged over the LSTM state, the KV cache, any future mixer, and the uncached loop.
A cached session steps the model through its accelerator (:mod:`hybrid.accel`), so every
strategy runs on the fast path once ``optimize_for_inference`` installed one; plain greedy
decoding and sampling ask the accelerator for whole advances, one call per token where it can.
Everything per step is a batched tensor operation on the model's device; the host looks
at the device only to decide whether to drop finished sequences, every
``eos_check_interval`` steps.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from hybrid.generation.config import GenerationConfig, with_model_defaults
from hybrid.generation.rules import DecodingRules
from hybrid.generation.sessions import CachedSession, StaticSession, UncachedSession
from hybrid.generation.stepping import Rows
from hybrid.inputs import check_length, check_token_ids, source_mask


@dataclasses.dataclass
class GenerateOutput:
    """What ``generate(..., return_dict_in_generate=True)`` returns (transformers' field names).

    ``sequences``: (N, L) ids after BOS (forced prefix included), EOS included, padding after.
    ``scores``: one (N_rows, vocab) tensor per step of the processed scores (log-probabilities in
    beam search, where N_rows counts every beam); None when ``output_scores=False``.
    ``sequences_scores``: (N,) the sum of the chosen tokens' log-probabilities under the processed
    scores (greedy, sampling), or the length-penalised beam score (beam search).
    ``beam_indices``: (N, L) for beam search: the row (source * num_beams + beam) each token came from.

    In beam search a source may have fewer finished hypotheses than ``num_return_sequences`` (when
    nothing but EOS is allowed early, say); each missing one is a row of nothing but padding, scored
    ``-inf`` in ``sequences_scores``, with ``beam_indices`` 0.
    """

    sequences: Tensor
    scores: tuple[Tensor, ...] | None
    sequences_scores: Tensor
    beam_indices: Tensor | None = None


@torch.inference_mode()
def generate(model, src_ids: Tensor, src_mask: Tensor | None = None, **options) -> Tensor | GenerateOutput:
    """Decode ``src_ids`` (B, S) with the options of :class:`GenerationConfig` (transformers' names).

    Options not given are the model's own defaults (``model.generation_config``, as transformers'
    ``generation_config``), then :class:`GenerationConfig`'s.
    Returns (B * num_return_sequences, L) ids after the decoder start, EOS included, ``pad_id`` after
    it, or a :class:`GenerateOutput` with ``return_dict_in_generate=True`` (or ``return_dict=True``).
    Every option is checked before any compute. Padding and the decoder start are never generated
    (unless an EOS id), unless a ``SuppressTokensLogitsProcessor`` of your own takes the place of that
    ban (transformers' rule).
    """
    return decode(model, src_ids, src_mask, GenerationConfig.from_kwargs(**with_model_defaults(model, options)))


def _session_class(model, config: GenerationConfig) -> type:
    """Where the logits come from: the rerun decoder (``use_cache=False``), or the cached state stepped by the
    model's accelerator, in a batch that keeps every row where the accelerator needs one shape (CUDA graphs)."""
    if not config.use_cache:
        return UncachedSession
    return StaticSession if model.accelerator.keeps_every_row else CachedSession


def decode(model, src_ids: Tensor, src_mask: Tensor | None, config: GenerationConfig,
           session_class: type | None = None) -> Tensor | GenerateOutput:
    """:func:`generate` over sessions of ``session_class``, made as ``session_class(model, src_ids,
    src_mask, max_steps)``: by default the one the model and ``config`` call for (the tests pass
    :class:`StaticSession` to run a CUDA-graph decode's batch, which never shrinks, uncaptured)."""
    model_config = model.config
    src_ids = check_token_ids("src_ids", src_ids, model_config.vocab_size, ndim=2)
    src_mask = source_mask(src_ids, src_mask, model_config.pad_id)
    session_class = session_class or _session_class(model, config)
    run = _Run(model, config, src_ids)
    session = session_class(model, src_ids, src_mask, run.total_steps)
    if config.num_beams > 1:
        search = _beam_search
    elif session_class is not UncachedSession and _one_call_per_token(model, run):
        search = _advance_rows
    else:
        search = _sample
    output = search(run, session)
    if config.streamer is not None:
        config.streamer.end()
    return output if config.return_dict_in_generate else output.sequences


class _Run:
    """The checked, derived facts of one ``generate`` call that every strategy needs."""

    def __init__(self, model, config: GenerationConfig, src_ids: Tensor) -> None:
        model_config = model.config
        self.config = config
        self.device = src_ids.device
        self.sources = src_ids.shape[0]
        self.vocab_size = model_config.vocab_size
        self.rules = DecodingRules(config, model_config)
        self.bos_id, self.pad_id = self.rules.bos_id, self.rules.pad_id
        self.prefix, self.prefix_lengths, self.first_free_step = self.rules.forced_prefix(self.sources, self.device)
        forced = self.prefix.shape[1] - 1
        check_length("max_new_tokens", config.max_new_tokens, model_config.max_positions - forced,
                     "max_positions" if forced == 0 else f"max_positions - forced prefix length {forced}")
        self.total_steps = forced + config.max_new_tokens
        self.keep_scores = config.return_dict_in_generate and config.output_scores is not False
        self.eos_check_interval = config.check_interval(self.device)

    def next_scores(self, scores: Tensor, sequences: Tensor, step: int, prefix: Tensor,
                    prefix_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The processed scores for column ``step + 1`` (rows, vocab), which rows were forced, and how many
        tokens each row has generated before it. A step where every row is forced skips the processors."""
        generated = step + 1 - prefix_lengths  # (rows,)
        if step >= self.first_free_step:
            scores = self.rules.process(sequences[:, :step + 1], scores, generated)
        scores, forced = self.rules.force(scores, prefix, prefix_lengths, step)
        return scores, forced, generated

    def is_check_step(self, step: int) -> bool:
        """Whether the host reads the end-of-sequence flags after ``step``."""
        return (step + 1) % self.eos_check_interval == 0 or step + 1 == self.total_steps


def _sample(run: _Run, session) -> GenerateOutput:
    """Greedy decoding or multinomial sampling, ``num_return_sequences`` rows per source."""
    config, rules, device = run.config, run.rules, run.device
    copies = config.num_return_sequences
    if copies > 1:
        session.expand(copies)
    rows_total = run.sources * copies
    prefix = run.prefix.repeat_interleave(copies, dim=0)
    prefix_lengths = run.prefix_lengths.repeat_interleave(copies)
    # Working buffers shrink with the batch; `output` keeps every original row.
    sequences = torch.full((rows_total, run.total_steps + 1), run.pad_id, dtype=torch.long, device=device)
    sequences[:, :prefix.shape[1]] = prefix
    sequences[:, 0] = run.bos_id
    output = sequences.clone()
    rows = torch.arange(rows_total, device=device)  # original row of each working row
    finished = torch.zeros(rows_total, dtype=torch.bool, device=device)
    logprob_sums = torch.zeros(rows_total, device=device)
    all_logprobs = torch.zeros(rows_total, device=device)
    step_scores: list[Tensor] = []
    # Columns up to the last one that some row generated: the width of the output. Counted, not found by
    # trimming trailing padding, because a user's SuppressTokensLogitsProcessor may let a row generate padding.
    width = torch.zeros((), dtype=torch.long, device=device)
    for step in range(run.total_steps):
        logits = session.step(sequences[:, step])  # (rows, vocab)
        scores, forced, generated = run.next_scores(logits.float(), sequences, step, prefix, prefix_lengths)
        free = step >= run.first_free_step
        tokens = (rules.choose(scores) if free else prefix[:, step + 1]).masked_fill(finished, run.pad_id)
        width += (~finished).any()
        if config.return_dict_in_generate:  # a full-vocabulary log-softmax per step, only when asked for
            token_logprobs = F.log_softmax(scores, dim=-1).gather(1, tokens[:, None]).squeeze(1)
            logprob_sums += token_logprobs.masked_fill(finished | forced, 0.0)
        sequences[:, step + 1] = tokens
        if run.keep_scores:
            step_scores.append(_scatter_rows(scores, rows, rows_total, float("-inf")))
        if config.streamer is not None:
            config.streamer.put(_scatter_rows(tokens, rows, rows_total, run.pad_id))
        ended = rules.ends(tokens, generated + 1)
        if free and rules.stopping:
            ended |= rules.stops(sequences[:, :step + 2], scores)
        finished |= ~forced & ended
        if run.is_check_step(step):
            keep = _rows_still_running(finished, copies)
            if session.keeps_every_row:
                if keep.numel() == 0:
                    break
                continue
            if keep.numel() < rows.numel():
                output.index_copy_(0, rows, sequences)
                all_logprobs.index_copy_(0, rows, logprob_sums)
                if keep.numel() == 0:
                    break
                session.reorder(keep)
                rows, sequences, finished = rows[keep], sequences[keep], finished[keep]
                prefix, prefix_lengths, logprob_sums = prefix[keep], prefix_lengths[keep], logprob_sums[keep]
    output.index_copy_(0, rows, sequences)
    all_logprobs.index_copy_(0, rows, logprob_sums)
    return GenerateOutput(sequences=output[:, 1:int(width) + 1],
                          scores=tuple(step_scores) if run.keep_scores else None,
                          sequences_scores=all_logprobs)


def _rows_still_running(finished: Tensor, copies: int) -> Tensor:
    """The indices of the working rows whose source has a row still running. The ``copies`` rows of one source
    (its samples) share its memory, so a source leaves the batch only once all of them are done."""
    return (~finished.view(-1, copies).all(dim=1)).repeat_interleave(copies).nonzero().squeeze(1)


def _one_call_per_token(model, run: _Run) -> bool:
    """Whether the model's accelerator can decode this call with one call per token: greedy decoding or
    sampling whose rules it advances in its compiled step, nothing forced, streamed or returned besides ids."""
    config = run.config
    return (model.accelerator.advances(run.rules) and config.decoder_input_ids is None
            and config.streamer is None and not config.return_dict_in_generate)


def _advance_rows(run: _Run, session) -> GenerateOutput:
    """Greedy decoding or sampling as rows that the accelerator advances in one call per token
    (``_one_call_per_token``). It equals :func:`_sample` token for token, seeded draws included: the rows
    are the same (``num_return_sequences`` per source, a source leaving at a check once all its rows are
    done, unless the session keeps every row), and so are the draws (``DecodingRules.choose``)."""
    rules, accelerator, max_new_tokens = run.rules, session.model.accelerator, run.config.max_new_tokens
    copies = run.config.num_return_sequences
    if copies > 1:
        session.expand(copies)
    rows = Rows.start(run.sources * copies, max_new_tokens, run.bos_id, run.pad_id, run.device)
    output = rows.outputs.clone()
    index = torch.arange(run.sources * copies, device=run.device)  # original row of each working row
    width = torch.zeros((), dtype=torch.long, device=run.device)  # as in _sample
    for step in range(max_new_tokens):
        width += (~rows.finished).any()
        accelerator.advance(rules, session.state, rows)
        if run.is_check_step(step) and bool(rows.finished.any()):
            keep = _rows_still_running(rows.finished, copies)
            if keep.numel() == 0:
                break
            if session.keeps_every_row or keep.numel() == index.numel():
                continue
            output.index_copy_(0, index, rows.outputs)
            session.reorder(keep)
            rows, index = rows.select(keep), index[keep]
    output.index_copy_(0, index, rows.outputs)
    return GenerateOutput(sequences=output[:, :int(width)], scores=None,
                          sequences_scores=torch.zeros(run.sources * copies, device=run.device))


def _beam_search(run: _Run, session) -> GenerateOutput:
    """Beam search as transformers' ``GenerationMixin._beam_search`` does it, vectorised over sources.

    Each step keeps the best ``max(2, 1 + len(eos_ids)) * num_beams`` candidates of a source. A
    candidate that ends (EOS, ``max_new_tokens``, or a stopping criterion) and ranks among the top
    ``num_beams`` joins the source's pool of the ``num_beams`` best finished hypotheses, scored
    ``sum_logprobs / generated_tokens ** length_penalty``; the best ``num_beams`` that do not end
    run on. A source stops taking hypotheses by transformers' ``early_stopping`` rules (sticky, as
    there), and leaves the working batch at the next check. Unlike transformers, which stops the
    whole batch together, a source also ends when none of its candidates can run on, so every
    source decodes as it would alone.
    """
    config, rules, device = run.config, run.rules, run.device
    beams, vocab = config.num_beams, run.vocab_size
    session.expand(beams)
    width = run.total_steps + 1
    candidates = max(2, 1 + len(rules.eos_ids)) * beams  # enough that `beams` of them do not end
    prefix = run.prefix.repeat_interleave(beams, dim=0)
    prefix_lengths = run.prefix_lengths.repeat_interleave(beams)
    sequences = torch.full((run.sources * beams, width), run.pad_id, dtype=torch.long, device=device)
    sequences[:, :prefix.shape[1]] = prefix
    sequences[:, 0] = run.bos_id
    origins = torch.zeros_like(sequences)  # for beam_indices: the row each token was chosen from
    # Only the first beam is live at the start, so the others do not duplicate it.
    beam_scores = torch.full((run.sources, beams), float("-inf"), device=device)
    beam_scores[:, 0] = 0.0
    pool_scores = torch.full((run.sources, beams), float("-inf"), device=device)
    pool_sequences = torch.full((run.sources, beams, width), run.pad_id, dtype=torch.long, device=device)
    pool_origins = torch.zeros_like(pool_sequences)
    pool_lengths = torch.zeros((run.sources, beams), dtype=torch.long, device=device)  # columns after BOS
    sources = torch.arange(run.sources, device=device)  # original source of each working group
    closed = torch.zeros(run.sources, dtype=torch.bool, device=device)  # the pool takes no more hypotheses
    step_scores: list[Tensor] = []
    beam_offsets = torch.arange(beams, device=device)
    top_ranks = torch.arange(candidates, device=device) < beams
    for step in range(run.total_steps):
        groups = sources.numel()
        logits = session.step(sequences[:, step])  # (groups * beams, vocab)
        logprobs, forced, generated = run.next_scores(F.log_softmax(logits.float(), dim=-1), sequences, step,
                                                      prefix, prefix_lengths)
        if run.keep_scores:
            rows = (sources[:, None] * beams + beam_offsets).flatten()
            step_scores.append(_scatter_rows(logprobs, rows, run.sources * beams, float("-inf")))
        totals = (logprobs + beam_scores.view(-1, 1)).view(groups, beams * vocab)
        top_scores, top_index = totals.topk(candidates, dim=1)  # sorted, best first
        parent, token = top_index // vocab, top_index % vocab  # (groups, candidates)
        parent_rows = parent + (torch.arange(groups, device=device) * beams)[:, None]
        # The beams of a source share its prefix, so they share their forced steps and counts.
        group_forced = forced.view(groups, beams)[:, 0]
        group_generated = generated.view(groups, beams)[:, 0] + 1  # the new token included

        ends = rules.ends(token, group_generated[:, None])
        if step >= run.first_free_step and rules.stopping:
            candidate_ids = torch.cat([sequences.index_select(0, parent_rows.flatten())[:, :step + 1],
                                       token.reshape(-1, 1)], dim=1)
            parent_scores = logprobs.index_select(0, parent_rows.flatten())
            ends |= rules.stops(candidate_ids, parent_scores).view(groups, candidates)
        ends &= ~group_forced[:, None]

        # Hypotheses that end here and rank among the best `beams` candidates join the pool.
        joining = ends & top_ranks & top_scores.isfinite() & ~closed[sources][:, None]
        penalty = group_generated.to(top_scores.dtype)[:, None] ** config.length_penalty
        _merge_into_pool(pool_scores, pool_sequences, pool_origins, pool_lengths, sources,
                         torch.where(joining, top_scores / penalty, float("-inf"))[:, :beams],
                         sequences, origins, parent_rows[:, :beams], token[:, :beams], step, run.pad_id)

        # The next beams: the best candidates that do not end.
        running = torch.where(ends, float("-inf"), top_scores).topk(beams, dim=1)
        chosen_rows = parent_rows.gather(1, running.indices).flatten()
        chosen_tokens = token.gather(1, running.indices).flatten()
        beam_scores = running.values
        sequences = sequences.index_select(0, chosen_rows)
        sequences[:, step + 1] = chosen_tokens
        if config.return_dict_in_generate:
            origins = origins.index_select(0, chosen_rows)
            origins[:, step + 1] = sources.repeat_interleave(beams) * beams + chosen_rows % beams
        session.reorder(chosen_rows)

        stuck = ~beam_scores[:, 0].isfinite()  # every candidate ended: nothing runs on
        closed[sources] |= stuck | _pool_is_closed(config, pool_scores[sources], beam_scores, group_generated)
        if run.is_check_step(step):
            keep_groups = (~closed[sources]).nonzero().squeeze(1)
            if keep_groups.numel() == 0:
                break
            if keep_groups.numel() < groups and not session.keeps_every_row:
                keep = (keep_groups[:, None] * beams + beam_offsets).flatten()
                session.reorder(keep)
                sources, beam_scores = sources[keep_groups], beam_scores[keep_groups]
                sequences, origins = sequences[keep], origins[keep]
                prefix, prefix_lengths = prefix[keep], prefix_lengths[keep]

    best = config.num_return_sequences
    # A slot that no hypothesis reached keeps whatever a dead beam, tied with it at -inf, left there: it is
    # returned as the no-hypothesis row, all padding and scored -inf, never as a fragment such as [pad, EOS].
    no_hypothesis = pool_scores == float("-inf")  # (sources, beams)
    pool_sequences.masked_fill_(no_hypothesis[:, :, None], run.pad_id)
    pool_origins.masked_fill_(no_hypothesis[:, :, None], 0)
    # As wide as the longest hypothesis returned, which may end with a generated padding id (see _sample).
    longest = int(pool_lengths.masked_fill(no_hypothesis, 0)[:, :best].max())
    sequences = pool_sequences[:, :best, 1:longest + 1].flatten(0, 1)
    beam_indices = pool_origins[:, :best, 1:sequences.shape[1] + 1].flatten(0, 1)
    return GenerateOutput(sequences=sequences, scores=tuple(step_scores) if run.keep_scores else None,
                          sequences_scores=pool_scores[:, :best].flatten(),
                          beam_indices=beam_indices if config.return_dict_in_generate else None)


def _merge_into_pool(pool_scores: Tensor, pool_sequences: Tensor, pool_origins: Tensor, pool_lengths: Tensor,
                     sources: Tensor, new_scores: Tensor, sequences: Tensor, origins: Tensor, rows: Tensor,
                     tokens: Tensor, step: int, pad_id: int) -> None:
    """Keep each source's ``beams`` best finished hypotheses: the pool's and the new ones (-inf = none).

    The new hypotheses (groups, n) extend the working ``rows`` with ``tokens`` at column ``step + 1``.
    """
    beams = pool_scores.shape[1]
    groups = sources.numel()
    columns = step + 2
    new_sequences = sequences.index_select(0, rows.flatten()).view(groups, -1, sequences.shape[1])
    new_origins = origins.index_select(0, rows.flatten()).view(groups, -1, origins.shape[1])
    new_sequences[:, :, columns - 1] = tokens
    new_origins[:, :, columns - 1] = sources[:, None] * beams + rows % beams
    new_sequences[:, :, columns:] = pad_id  # a forced prefix may reach past the hypothesis' end
    new_lengths = torch.full_like(rows, columns - 1)
    scores = torch.cat([pool_scores[sources], new_scores], dim=1)  # (groups, 2 * beams)
    best = scores.topk(beams, dim=1)
    merged = torch.cat([pool_sequences[sources], new_sequences], dim=1)
    merged_origins = torch.cat([pool_origins[sources], new_origins], dim=1)
    index = best.indices[:, :, None].expand(-1, -1, merged.shape[2])
    pool_scores[sources] = best.values
    pool_sequences[sources] = merged.gather(1, index)
    pool_origins[sources] = merged_origins.gather(1, index)
    pool_lengths[sources] = torch.cat([pool_lengths[sources], new_lengths], dim=1).gather(1, best.indices)


def _pool_is_closed(config: GenerationConfig, pool_scores: Tensor, beam_scores: Tensor, generated: Tensor) -> Tensor:
    """transformers' early-stopping rules (``_check_early_stop_heuristic``): the pool is full and, unless
    ``early_stopping=True``, no running beam can still beat its worst hypothesis. ``generated`` (groups,)
    counts the tokens generated so far; with ``"never"`` and a positive length penalty the best beam is
    scored at ``max_new_tokens``, the longest it can get."""
    full = pool_scores[:, -1].isfinite()
    if config.early_stopping is True:
        return full
    best_running = beam_scores[:, 0]
    if config.early_stopping == "never" and config.length_penalty > 0:
        # In the scores' dtype, so a huge penalty gives inf, as transformers' tensors do, not an OverflowError.
        bound = best_running / best_running.new_tensor(float(config.max_new_tokens)) ** config.length_penalty
    else:
        bound = best_running / generated.to(best_running.dtype) ** config.length_penalty
    return full & (pool_scores[:, -1] >= bound)


def _scatter_rows(values: Tensor, rows: Tensor, total: int, fill) -> Tensor:
    """Place the working rows' ``values`` at their original rows of a ``total``-row tensor."""
    placed = values.new_full((total, *values.shape[1:]), fill)
    return placed.index_copy_(0, rows, values)
