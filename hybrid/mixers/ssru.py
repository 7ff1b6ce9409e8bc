"""The SSRU mixer: Marian's simpler simple recurrent unit (Kim et al., 2019, "From Research to
Production and Back: Ludicrously Fast Neural Machine Translation").

    f_t = sigmoid(W_f x_t + b_f)
    c_t = f_t * c_{t-1} + (1 - f_t) * W x_t
    y_t = relu(c_t)

The recurrence is elementwise: every matrix product depends on ``x_t`` alone, so training computes
them for the whole target at once and a step is two projections and a few vector operations.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.mixers.base import Mixer, MixerOptions, MixerState, Position
from hybrid.validators import check_int


@dataclasses.dataclass(frozen=True)
class ScanOptions(MixerOptions):
    """``chunk_size``: how many positions the parallel form solves at once (a chunk costs
    chunk_size^2 * d_model memory per sequence); the result does not depend on it."""

    chunk_size: int = 32

    def __post_init__(self) -> None:
        check_int("chunk_size", self.chunk_size, at_least=1)


def linear_recurrence(log_decay: Tensor, inputs: Tensor, chunk_size: int) -> Tensor:
    """``c_t = exp(log_decay_t) * c_{t-1} + inputs_t`` from ``c_{-1} = 0``, for all t: (B, T, D) -> (B, T, D).

    Within a chunk, ``c_t = sum_{s<=t} exp(L_t - L_s) inputs_s + exp(L_t) c_before`` with ``L`` the
    cumulative log decay; the differences are at most 0, so nothing overflows, and the masked
    entries are -inf before ``exp`` so their gradient is 0, not NaN. Chunks run in sequence.
    """
    batch, length, width = inputs.shape
    carry = inputs.new_zeros(batch, width)
    outputs = []
    for start in range(0, length, chunk_size):
        log_f, u = log_decay[:, start:start + chunk_size], inputs[:, start:start + chunk_size]  # (B, C, D)
        size = u.shape[1]
        cumulative = log_f.cumsum(dim=1)  # (B, C, D)
        causal = torch.ones(size, size, dtype=torch.bool, device=u.device).tril()  # [t, s]: s <= t
        gaps = (cumulative[:, :, None] - cumulative[:, None, :]).masked_fill(~causal[None, :, :, None], float("-inf"))
        chunk = torch.einsum("btsd,bsd->btd", gaps.exp(), u) + cumulative.exp() * carry[:, None]
        outputs.append(chunk)
        carry = chunk[:, -1]
    return torch.cat(outputs, dim=1)


@dataclasses.dataclass
class SSRUState(MixerState):
    """``c`` of one SSRU layer: one vector per sequence."""

    cell: Tensor  # (B, D)


class SSRUMixer(Mixer):
    """The SSRU: a forget gate and a projection of the input, mixed elementwise across positions."""

    Options = ScanOptions

    def __init__(self, config, options: ScanOptions) -> None:
        super().__init__()
        self.chunk_size = options.chunk_size
        self.gate = nn.Linear(config.d_model, config.d_model)  # W_f, b_f
        self.value = nn.Linear(config.d_model, config.d_model, bias=False)  # W

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate(x)  # (B, T, D), before the sigmoid
        # log f and 1 - f from the same logits, without computing log(sigmoid) of a rounded value.
        inputs = torch.sigmoid(-gate) * self.value(x)
        return F.relu(linear_recurrence(F.logsigmoid(gate), inputs, self.chunk_size))

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> SSRUState:
        width = self.value.out_features
        return SSRUState(cell=torch.zeros(batch_size, width, device=device, dtype=dtype))

    def step(self, x: Tensor, state: SSRUState, position: Position) -> Tensor:
        # Elementwise after the two projections; no position is needed.
        forget = torch.sigmoid(self.gate(x))  # (B, D)
        value = self.value(x)
        state.cell.sub_(value).mul_(forget).add_(value)  # f * c + (1 - f) * v = f * (c - v) + v
        return F.relu(state.cell)
