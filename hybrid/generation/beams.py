"""Beam search as transformers' ``GenerationMixin._beam_search`` does it, vectorised over sources.

Each step keeps the best ``max(2, 1 + len(eos_ids)) * num_beams`` candidates of a source
(:func:`best_candidates`). A candidate that ends (EOS, ``max_new_tokens``, or a stopping criterion)
and ranks among the top ``num_beams`` joins the source's pool of the ``num_beams`` best finished
hypotheses (:class:`Pool`), scored ``sum_logprobs / generated_tokens ** length_penalty``; the best
``num_beams`` that do not end run on (:func:`split_candidates`). A source stops taking hypotheses by
transformers' ``early_stopping`` rules (:func:`pool_is_closed`, sticky, as there), and leaves the
working batch at the next check. Unlike transformers, which stops the whole batch together, a source
also ends when none of its candidates can run on, so every source decodes as it would alone.

Two loops run it, and share each of those rules:

- :func:`beam_search` runs any options (forced prefixes, stopping criteria, processors that read the
  history, scores and beam indices returned), the rules in PyTorch around the accelerator's step;
- :func:`beam_search_by_advances` runs the options an accelerator compiles with its step (rules that
  run in a graph, ``DecodingRules.runs_in_graph``, and nothing forced or returned but the ids): each
  token is one :func:`advance_beams` (the step, the rules, the choice of beams and the reorder of the
  state), which the fast path on a CPU runs as one call into ONNX Runtime
  (:meth:`hybrid.accel.Accelerator.advance_beams`). Only the pool, which changes when hypotheses end,
  is kept on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from hybrid.generation.output import GenerateOutput, scatter_rows


def candidate_count(rules, num_beams: int) -> int:
    """How many candidates a source keeps per step: enough that ``num_beams`` of them do not end."""
    return max(2, 1 + len(rules.eos_ids)) * num_beams


def best_candidates(logprobs: Tensor, beam_scores: Tensor, count: int) -> tuple[Tensor, Tensor, Tensor]:
    """The best ``count`` continuations of each group over its beams x vocabulary, best first: their scores
    (groups, count), the rows they extend (the group's beams are consecutive rows) and their tokens.
    ``logprobs`` (rows, vocab) are the processed scores; ``beam_scores`` (groups, beams) the beams'."""
    beams, vocab = beam_scores.shape[1], logprobs.shape[1]
    totals = (logprobs + beam_scores.reshape(-1, 1)).reshape(-1, beams * vocab)
    top_scores, top_index = totals.topk(count, dim=1)
    first_rows = torch.arange(totals.shape[0], device=totals.device) * beams
    return top_scores, top_index // vocab + first_rows[:, None], top_index % vocab


def split_candidates(top_scores: Tensor, ends: Tensor, closed: Tensor, lengths: Tensor, beams: int,
                     length_penalty: float) -> tuple[Tensor, Tensor, Tensor]:
    """Which candidates (groups, count) join the pool and which run on.

    Returns the length-penalised scores of the hypotheses that join (groups, ``beams``; -inf for none: a
    candidate that ``ends``, ranks among the best ``beams``, is finite, in a group not ``closed``), then the
    running beams' indices among the candidates and their scores (groups, ``beams``): the best that do not
    end. ``lengths`` (broadcast to the candidates) counts each candidate's generated tokens."""
    top_ranks = torch.arange(top_scores.shape[1], device=top_scores.device) < beams
    joining = ends & top_ranks & top_scores.isfinite() & ~closed[:, None]
    penalty = lengths.to(top_scores.dtype) ** length_penalty
    joined = torch.where(joining, top_scores / penalty, float("-inf"))[:, :beams]
    running = torch.where(ends, float("-inf"), top_scores).topk(beams, dim=1)
    return joined, running.indices, running.values


def hypotheses(sequences: Tensor, rows: Tensor, tokens: Tensor, column: int | Tensor, pad_id: int) -> Tensor:
    """The sequences (groups, n, width) that extend ``rows`` (groups, n) of ``sequences`` with ``tokens`` at
    ``column``, padding after it (a forced prefix may reach past a hypothesis' end)."""
    extended = sequences.index_select(0, rows.flatten()).view(*rows.shape, sequences.shape[1])
    columns = torch.arange(sequences.shape[1], device=sequences.device)
    return torch.where(columns == column, tokens[..., None], extended.masked_fill(columns > column, pad_id))


def put_column(sequences: Tensor, column: int | Tensor, tokens: Tensor) -> Tensor:
    """``sequences`` (rows, width) with ``tokens`` (rows,) at ``column``, out of place."""
    columns = torch.arange(sequences.shape[1], device=sequences.device)
    return torch.where(columns == column, tokens[:, None], sequences)


def pool_is_closed(config, max_new_tokens: int | Tensor, pool_worst: Tensor, beam_scores: Tensor,
                   generated: Tensor) -> Tensor:
    """transformers' early-stopping rules (``_check_early_stop_heuristic``), per group: the pool is full (its
    worst score ``pool_worst`` is finite) and, unless ``early_stopping=True``, no running beam can still beat
    that worst hypothesis. ``generated`` (broadcast to the groups) counts the tokens generated so far; with
    ``"never"`` and a positive length penalty the best beam is scored at ``max_new_tokens``, the longest it
    can get."""
    full = pool_worst.isfinite()
    if config.early_stopping is True:
        return full
    best_running = beam_scores[:, 0]
    if config.early_stopping == "never" and config.length_penalty > 0:
        # In the scores' dtype, so a huge penalty gives inf, as transformers' tensors do, not an OverflowError.
        bound = best_running / (best_running.new_zeros(()) + max_new_tokens) ** config.length_penalty
    else:
        bound = best_running / generated.to(best_running.dtype) ** config.length_penalty
    return full & (pool_worst >= bound)


class Pool:
    """Each source's ``beams`` best finished hypotheses, best first: scores (-inf: none yet), ids after the
    decoder start, the row each token came from (for ``beam_indices``) and their lengths."""

    def __init__(self, sources: int, beams: int, width: int, pad_id: int, device) -> None:
        self.pad_id = pad_id
        self.scores = torch.full((sources, beams), float("-inf"), device=device)
        self.sequences = torch.full((sources, beams, width), pad_id, dtype=torch.long, device=device)
        self.origins = torch.zeros_like(self.sequences)
        self.lengths = torch.zeros((sources, beams), dtype=torch.long, device=device)  # columns after BOS

    def worst(self, sources: Tensor) -> Tensor:
        """The worst score in each of ``sources``' pools: finite once the pool is full."""
        return self.scores[sources, -1]

    def merge(self, sources: Tensor, scores: Tensor, sequences: Tensor, origins: Tensor | None, length) -> None:
        """Keep the best of ``sources``' pools and of new hypotheses (groups, n; -inf: none) of ``length``
        generated tokens, their ``sequences`` (groups, n, width) and ``origins`` (or None: not kept)."""
        beams, width = self.scores.shape[1], self.sequences.shape[2]
        best = torch.cat([self.scores[sources], scores], dim=1).topk(beams, dim=1)
        index = best.indices[:, :, None].expand(-1, -1, width)
        self.scores[sources] = best.values
        self.sequences[sources] = torch.cat([self.sequences[sources], sequences], dim=1).gather(1, index)
        if origins is not None:
            self.origins[sources] = torch.cat([self.origins[sources], origins], dim=1).gather(1, index)
        lengths = torch.full_like(scores, length, dtype=torch.long)
        self.lengths[sources] = torch.cat([self.lengths[sources], lengths], dim=1).gather(1, best.indices)

    def output(self, best: int, keep_scores: bool, step_scores: list[Tensor],
               return_dict_in_generate: bool) -> GenerateOutput:
        """The ``best`` hypotheses of each source. A slot that no hypothesis reached keeps whatever a dead beam,
        tied with it at -inf, left there: it is returned as the no-hypothesis row, all padding and scored -inf,
        never as a fragment such as [pad, EOS]."""
        no_hypothesis = self.scores == float("-inf")  # (sources, beams)
        self.sequences.masked_fill_(no_hypothesis[:, :, None], self.pad_id)
        self.origins.masked_fill_(no_hypothesis[:, :, None], 0)
        # As wide as the longest hypothesis returned, which may end with a generated padding id (as in greedy).
        longest = int(self.lengths.masked_fill(no_hypothesis, 0)[:, :best].max())
        sequences = self.sequences[:, :best, 1:longest + 1].flatten(0, 1)
        beam_indices = self.origins[:, :best, 1:sequences.shape[1] + 1].flatten(0, 1)
        return GenerateOutput(sequences=sequences, scores=tuple(step_scores) if keep_scores else None,
                              sequences_scores=self.scores[:, :best].flatten(),
                              beam_indices=beam_indices if return_dict_in_generate else None)


@dataclasses.dataclass
class Beams:
    """The running beams of groups (one per source, its beams consecutive rows) that decode side by side:
    what :func:`advance_beams` reads and updates in place, and what it writes of the hypotheses that end."""

    tokens: Tensor  # (rows,) the token each beam feeds next
    scores: Tensor  # (groups, beams) each beam's summed log-probability, best first; -inf: no beam
    sequences: Tensor  # (rows, width) each beam's ids, the decoder start first
    closed: Tensor  # (groups,) bool: the group's pool takes no more hypotheses
    pool_worst: Tensor  # (groups,) read only: Pool.worst of each group's source
    ended_scores: Tensor  # (groups, beams) written: the penalised scores of the hypotheses that join; -inf: none
    ended_sequences: Tensor  # (groups, beams, width) written: their ids
    any_ended: Tensor  # () bool, written: some hypothesis joins

    @classmethod
    def start(cls, groups: int, beams: int, width: int, bos_id: int, pad_id: int, device) -> Beams:
        scores = torch.full((groups, beams), float("-inf"), device=device)
        scores[:, 0] = 0.0  # only the first beam is live at the start, so the others do not duplicate it
        sequences = torch.full((groups * beams, width), pad_id, dtype=torch.long, device=device)
        sequences[:, 0] = bos_id
        return cls(tokens=torch.full((groups * beams,), bos_id, dtype=torch.long, device=device), scores=scores,
                   sequences=sequences, closed=torch.zeros(groups, dtype=torch.bool, device=device),
                   pool_worst=torch.full((groups,), float("-inf"), device=device),
                   ended_scores=torch.full((groups, beams), float("-inf"), device=device),
                   ended_sequences=torch.full((groups, beams, width), pad_id, dtype=torch.long, device=device),
                   any_ended=torch.zeros((), dtype=torch.bool, device=device))

    def select(self, groups: Tensor) -> Beams:
        """Groups ``groups`` only, in that order."""
        beams = self.scores.shape[1]
        rows = (groups[:, None] * beams + torch.arange(beams, device=groups.device)).flatten()
        return Beams(self.tokens[rows], self.scores[groups], self.sequences[rows], self.closed[groups],
                     self.pool_worst[groups], self.ended_scores[groups], self.ended_sequences[groups],
                     self.any_ended.clone())


def advance_beams(step: Callable[[Tensor, object, Tensor], Tensor], rules, state, beams: Beams,
                  generated: int | Tensor) -> None:
    """One beam-search step of every group, in place: feed each beam's token (``step``, at position
    ``generated``, the tokens each beam has generated), score the candidates by ``rules``, write those that
    end and join the pool (:attr:`Beams.ended_scores`, for the host to merge), move the best that do not end
    on (tokens, scores, sequences, and the state's rows, reordered in place), and close the groups whose
    pool is done (:func:`pool_is_closed` against :attr:`Beams.pool_worst`) or whose every candidate ended.

    It reads no host value, so an accelerator runs it whole as one graph (``DecodingRules.runs_in_graph``:
    the rules read the newest scores and the counts alone)."""
    if not isinstance(generated, Tensor):
        generated = torch.tensor(generated, device=beams.tokens.device)
    num_beams = beams.scores.shape[1]
    logits = step(beams.tokens, state, generated)
    counts = torch.zeros_like(beams.tokens) + generated  # (rows,): the rules count per row
    logprobs = rules.process(beams.tokens[:, None], F.log_softmax(logits.float(), dim=-1), counts)
    top_scores, parent_rows, tokens = best_candidates(logprobs, beams.scores, candidate_count(rules, num_beams))
    length = generated + 1  # each candidate's generated tokens, itself included
    joined, running, running_scores = split_candidates(top_scores, rules.ends(tokens, length), beams.closed,
                                                       length, num_beams, rules.config.length_penalty)
    beams.ended_sequences.copy_(hypotheses(beams.sequences, parent_rows[:, :num_beams], tokens[:, :num_beams],
                                           length, rules.pad_id))
    beams.ended_scores.copy_(joined)
    beams.any_ended.copy_(joined.isfinite().any())
    chosen_rows = parent_rows.gather(1, running).flatten()
    chosen_tokens = tokens.gather(1, running).flatten()
    beams.sequences.copy_(put_column(beams.sequences.index_select(0, chosen_rows), length, chosen_tokens))
    beams.tokens.copy_(chosen_tokens)
    beams.scores.copy_(running_scores)
    stuck = ~running_scores[:, 0].isfinite()  # every candidate ended: nothing runs on
    beams.closed |= stuck | pool_is_closed(rules.config, rules.max_new_tokens, beams.pool_worst, running_scores,
                                           length)
    state.reorder_in_place(chosen_rows)  # in place: a compiled step holds the state's tensors by address


def beam_search_by_advances(run, session) -> GenerateOutput:
    """Beam search as the model's accelerator's advances (:func:`advance_beams`), one call per token where
    it compiles the rules; it equals :func:`beam_search` token for token. The host merges the pool when a
    hypothesis ends, and drops closed groups at the checks (unless the session keeps every row)."""
    config, rules, accelerator = run.config, run.rules, session.model.accelerator
    num_beams = config.num_beams
    session.expand(num_beams)
    width = run.total_steps + 1
    beams = Beams.start(run.sources, num_beams, width, run.bos_id, run.pad_id, run.device)
    pool = Pool(run.sources, num_beams, width, run.pad_id, run.device)
    sources = torch.arange(run.sources, device=run.device)  # original source of each working group
    for step in range(run.total_steps):
        session.state.reserve(step + 1)
        accelerator.advance_beams(rules, session.state, beams, step)
        if bool(beams.any_ended):
            pool.merge(sources, beams.ended_scores, beams.ended_sequences, None, step + 1)
            beams.pool_worst.copy_(pool.worst(sources))
            # A merge only raises a pool's worst score, so closing against the merged pool adds to what the
            # advance closed against the pool before it.
            beams.closed |= pool_is_closed(config, rules.max_new_tokens, beams.pool_worst, beams.scores,
                                           torch.tensor(step + 1, device=run.device))
        if run.is_check_step(step) and bool(beams.closed.any()):
            keep = (~beams.closed).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            if not session.keeps_every_row:
                session.reorder((keep[:, None] * num_beams + torch.arange(num_beams, device=run.device)).flatten())
                beams, sources = beams.select(keep), sources[keep]
    return pool.output(config.num_return_sequences, False, [], False)


def beam_search(run, session) -> GenerateOutput:
    """Beam search with any options (see the module's docstring): the rules in PyTorch around
    ``session.step``, a forced prefix, stopping criteria, scores and beam indices included."""
    config, rules, device = run.config, run.rules, run.device
    beams = config.num_beams
    session.expand(beams)
    width = run.total_steps + 1
    count = candidate_count(rules, beams)
    prefix = run.prefix.repeat_interleave(beams, dim=0)
    prefix_lengths = run.prefix_lengths.repeat_interleave(beams)
    start = Beams.start(run.sources, beams, width, run.bos_id, run.pad_id, device)
    beam_scores, sequences = start.scores, start.sequences
    sequences[:, :prefix.shape[1]] = prefix
    sequences[:, 0] = run.bos_id
    origins = torch.zeros_like(sequences)  # for beam_indices: the row each token was chosen from
    pool = Pool(run.sources, beams, width, run.pad_id, device)
    sources = torch.arange(run.sources, device=device)  # original source of each working group
    closed = torch.zeros(run.sources, dtype=torch.bool, device=device)  # the pool takes no more hypotheses
    step_scores: list[Tensor] = []
    beam_offsets = torch.arange(beams, device=device)
    for step in range(run.total_steps):
        groups = sources.numel()
        logits = session.step(sequences[:, step])  # (groups * beams, vocab)
        logprobs, forced, generated = run.next_scores(F.log_softmax(logits.float(), dim=-1), sequences, step,
                                                      prefix, prefix_lengths)
        if run.keep_scores:
            rows = (sources[:, None] * beams + beam_offsets).flatten()
            step_scores.append(scatter_rows(logprobs, rows, run.sources * beams, float("-inf")))
        top_scores, parent_rows, token = best_candidates(logprobs, beam_scores, count)
        # The beams of a source share its prefix, so they share their forced steps and counts.
        group_forced = forced.view(groups, beams)[:, 0]
        group_generated = generated.view(groups, beams)[:, 0] + 1  # the new token included

        ends = rules.ends(token, group_generated[:, None])
        if step >= run.first_free_step and rules.stopping:
            candidate_ids = torch.cat([sequences.index_select(0, parent_rows.flatten())[:, :step + 1],
                                       token.reshape(-1, 1)], dim=1)
            parent_scores = logprobs.index_select(0, parent_rows.flatten())
            ends |= rules.stops(candidate_ids, parent_scores).view(groups, count)
        ends &= ~group_forced[:, None]
        joined, running, beam_scores = split_candidates(top_scores, ends, closed[sources], group_generated[:, None],
                                                        beams, config.length_penalty)
        parents = parent_rows[:, :beams]
        pool.merge(sources, joined, hypotheses(sequences, parents, token[:, :beams], step + 1, run.pad_id),
                   hypotheses(origins, parents, sources[:, None] * beams + parents % beams, step + 1, 0)
                   if config.return_dict_in_generate else None, step + 1)

        chosen_rows = parent_rows.gather(1, running).flatten()
        sequences = put_column(sequences.index_select(0, chosen_rows), step + 1, token.gather(1, running).flatten())
        if config.return_dict_in_generate:
            origins = put_column(origins.index_select(0, chosen_rows), step + 1,
                                 sources.repeat_interleave(beams) * beams + chosen_rows % beams)
        session.reorder(chosen_rows)

        stuck = ~beam_scores[:, 0].isfinite()  # every candidate ended: nothing runs on
        closed[sources] |= stuck | pool_is_closed(config, config.max_new_tokens, pool.worst(sources), beam_scores,
                                                  group_generated)
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
    return pool.output(config.num_return_sequences, run.keep_scores, step_scores, config.return_dict_in_generate)
