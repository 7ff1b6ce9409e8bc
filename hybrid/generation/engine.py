"""``generate``: greedy, sampling and beam search over any decoding state.

The strategies only talk to a session (``step``, ``reorder``, ``expand``), so they run
unchanged over the LSTM state, the KV cache, any future mixer, and the uncached loop.
A cached session steps the model through its accelerator (:mod:`hybrid.accel`), so every
strategy runs on the fast path once ``optimize_for_inference`` installed one; plain greedy
decoding, sampling and beam search (:mod:`hybrid.generation.beams`) ask the accelerator for whole
advances, one call per token where it can.
Everything per step is a batched tensor operation on the model's device; the host looks
at the device only to decide whether to drop finished sequences, every
``eos_check_interval`` steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from hybrid.generation.beams import beam_search, beam_search_by_advances
from hybrid.generation.config import GenerationConfig, with_model_defaults
from hybrid.generation.output import GenerateOutput, scatter_rows
from hybrid.generation.rules import DecodingRules
from hybrid.generation.sessions import CachedSession, StaticSession, UncachedSession
from hybrid.generation.stepping import Rows
from hybrid.inputs import check_length, check_token_ids, source_mask


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
    by_advances = session_class is not UncachedSession and _one_call_per_token(model, run)
    if config.num_beams > 1:
        search = beam_search_by_advances if by_advances else beam_search
    else:
        search = _advance_rows if by_advances else _sample
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
            step_scores.append(scatter_rows(scores, rows, rows_total, float("-inf")))
        if config.streamer is not None:
            config.streamer.put(scatter_rows(tokens, rows, rows_total, run.pad_id))
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
    """Whether the model's accelerator can decode this call with one call per token: greedy decoding,
    sampling or beam search whose rules it advances in its compiled step, nothing forced, streamed or
    returned besides ids."""
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
        session.state.reserve(step + 1)
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
