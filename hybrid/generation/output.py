"""What ``generate`` returns, shared by its strategies: greedy and sampling (``engine``), beam search (``beams``)."""

from __future__ import annotations

import dataclasses

from torch import Tensor


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


def scatter_rows(values: Tensor, rows: Tensor, total: int, fill) -> Tensor:
    """Place the working rows' ``values`` at their original rows of a ``total``-row tensor."""
    placed = values.new_full((total, *values.shape[1:]), fill)
    return placed.index_copy_(0, rows, values)
