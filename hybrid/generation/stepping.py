"""One decoding step over rows that each sit at their own position: feed, choose, record, advance.

Continuous refill steps its slots with :func:`advance`, and so does ``generate``'s plain greedy
decoding on the fast path, where an accelerator compiles the whole function with the decoder step
(:meth:`hybrid.accel.Accelerator.advance`: one ONNX graph, or one CUDA graph): a token then costs one
call and no Python work. Either way the choice goes through :class:`~hybrid.generation.rules.DecodingRules`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor


@dataclasses.dataclass
class Rows:
    """The bookkeeping of rows that decode side by side, each tensor updated in place by :func:`advance`."""

    tokens: Tensor  # (B,) the token each row feeds next: BOS at its start
    positions: Tensor  # (B,) how many tokens each row has generated
    finished: Tensor  # (B,) bool: the row has ended (it steps on, fed padding, until it leaves)
    outputs: Tensor  # (B, max_new_tokens + 1) its generated ids; a finished row writes padding after its end

    @classmethod
    def start(cls, rows: int, max_new_tokens: int, bos_id: int, pad_id: int, device) -> Rows:
        return cls(tokens=torch.full((rows,), bos_id, dtype=torch.long, device=device),
                   positions=torch.zeros(rows, dtype=torch.long, device=device),
                   finished=torch.zeros(rows, dtype=torch.bool, device=device),
                   outputs=torch.full((rows, max_new_tokens + 1), pad_id, dtype=torch.long, device=device))

    def restart(self, index: Tensor, bos_id: int, pad_id: int) -> None:
        """Rows ``index`` begin a new sequence (refill hands them new sources)."""
        self.positions[index] = 0
        self.finished[index] = False
        self.tokens[index] = bos_id
        self.outputs[index] = pad_id

    def select(self, index: Tensor) -> Rows:
        """Rows ``index`` only, in that order."""
        return Rows(*(tensor[index] for tensor in dataclasses.astuple(self)))


def advance(step: Callable[[Tensor, object, Tensor], Tensor], rules, state, rows: Rows,
            noise: Tensor | None = None) -> Tensor:
    """Step every row once, in place, and return the processed scores (B, vocab).

    Each row feeds its token at its own position (``step`` is an accelerator's step or the eager
    step an accelerator compiles), its next token is chosen by ``rules`` (a sample from ``noise``
    where it is given: ``DecodingRules.choose``), written at its position in ``rows.outputs``, and
    the rows that end are marked. A finished row takes padding and keeps its position (below the
    state's capacity) until its caller drops or refills it.
    """
    last = rules.max_new_tokens - 1
    logits = step(rows.tokens, state, rows.positions.clamp(max=last))
    scores = rules.process(rows.tokens[:, None], logits.float(), rows.positions)  # only the newest column
    tokens = rules.choose(scores, noise).masked_fill(rows.finished, rules.pad_id)
    rows.outputs.scatter_(1, rows.positions[:, None], tokens[:, None])
    rows.positions += ~rows.finished
    ended = rules.ends(tokens, rows.positions)
    if rules.stopping:
        ended |= rules.stops(tokens[:, None], scores)
    rows.finished |= ended
    rows.tokens.copy_(tokens)
    return scores
