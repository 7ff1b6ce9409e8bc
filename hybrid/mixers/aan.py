"""The average attention network (Zhang et al., 2018, "Accelerating Neural Transformer via an Average
Attention Network"): each position attends to every earlier one with the same weight.

    a_t = FFN(mean(x_1 .. x_t))               the average layer
    i_t, f_t = sigmoid(W [x_t ; a_t] + b)     the gating layer
    y_t = i_t * x_t + f_t * a_t

A mean forgets the order of what it averages, so the paper's decoder relies on the sinusoidal
position encodings in its input. This model's embeddings carry no positions (attention's are
rotary, the recurrences need none), so the mixer adds the same sinusoids to its own input: x_t
above is the input plus PE(t). Without them an all-average decoder cannot tell "ab" from "ba".

Training takes the cumulative mean over the whole target; a step keeps the running sum and the
count, so the state has the same size at every length.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.layers import sinusoids
from hybrid.mixers.base import Mixer, MixerOptions, MixerState, Position
from hybrid.validators import check_int


@dataclasses.dataclass(frozen=True)
class AverageOptions(MixerOptions):
    """``ffn_size``: the inner width of the average layer's FFN; None means ``d_model``."""

    ffn_size: int | None = None

    def __post_init__(self) -> None:
        check_int("ffn_size", self.ffn_size, at_least=1, optional=True)


@dataclasses.dataclass
class AverageState(MixerState):
    """The running sum of the inputs and how many there were."""

    total: Tensor  # (B, D)
    count: Tensor  # (B, 1), float: what the sum is divided by


class AverageAttentionMixer(Mixer):
    """The average layer and its gating layer (the residual connection is the decoder layer's)."""

    Options = AverageOptions

    def __init__(self, config, options: AverageOptions) -> None:
        super().__init__()
        d_model = config.d_model
        inner = options.ffn_size or d_model
        self.ffn_in, self.ffn_out = nn.Linear(d_model, inner), nn.Linear(inner, d_model)
        self.gates = nn.Linear(2 * d_model, 2 * d_model)  # the input gate i and the forget gate f
        self.dropout = nn.Dropout(config.dropout)  # inside its FFN, as the paper's; never on the output
        # Derived from the config, so not saved (as the rotary tables).
        self.register_buffer("positions", sinusoids(config.max_positions, d_model, interleaved=True), persistent=False)

    def _mix(self, x: Tensor, average: Tensor) -> Tensor:
        averaged = self.ffn_out(self.dropout(F.relu(self.ffn_in(average))))
        input_gate, forget_gate = torch.sigmoid(self.gates(torch.cat([x, averaged], dim=-1))).chunk(2, dim=-1)
        return input_gate * x + forget_gate * averaged

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.positions[:x.shape[1]].to(x.dtype)  # (B, T, D)
        counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]  # (T, 1)
        return self._mix(x, x.cumsum(dim=1) / counts)

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> AverageState:
        width = self.ffn_out.out_features
        return AverageState(total=torch.zeros(batch_size, width, device=device, dtype=dtype),
                            count=torch.zeros(batch_size, 1, device=device, dtype=dtype))

    def step(self, x: Tensor, state: AverageState, position: Position) -> Tensor:
        # A (B,) position gives each row its own encoding; an int or a 0-d tensor one for all.
        if isinstance(position, Tensor):
            x = x + self.positions.index_select(0, position.expand(x.shape[0])).to(x.dtype)
        else:
            x = x + self.positions[position].to(x.dtype)
        # The count is kept in the state rather than read from the position, so that no shape or
        # division depends on the position's form, and a reset row starts again from 0.
        state.total.add_(x)
        state.count.add_(1.0)
        return self._mix(x, state.total / state.count)
