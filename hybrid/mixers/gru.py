"""The GRU mixer: an ``nn.GRU`` in place of the decoder's self-attention, handled like the LSTM."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.mixers.base import Mixer, MixerState, Position
from hybrid.mixers.lstm import RecurrentOptions


@dataclasses.dataclass
class GRUState(MixerState):
    """``h`` of one GRU layer: one vector per sequence, whatever the length decoded."""

    hidden: Tensor  # (B, H)


class GRUMixer(Mixer):
    """One ``nn.GRU`` layer of width ``options.hidden_size``, projected back to ``d_model`` (see ``RecurrentOptions``).

    Training runs the whole target through one ``nn.GRU`` call. A step applies PyTorch's GRU
    equations (gates r, z, n) to the same weights and writes ``h`` in place:
    ``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))``, ``h = n + z * (h - n)``.
    """

    Options = RecurrentOptions

    def __init__(self, config, options: RecurrentOptions) -> None:
        super().__init__()
        self.width = options.width(config.d_model)
        self.gru = nn.GRU(config.d_model, self.width, batch_first=True)
        self.out = options.projection(config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        y, _ = self.gru(x)  # (B, T, H)
        return self.out(y)

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> GRUState:
        return GRUState(hidden=torch.zeros(batch_size, self.width, device=device, dtype=dtype))

    def step(self, x: Tensor, state: GRUState, position: Position) -> Tensor:
        # The recurrence needs no position: every form of it is accepted and unused.
        gru, width = self.gru, self.width
        from_input = F.linear(x, gru.weight_ih_l0, gru.bias_ih_l0)  # (B, 3H): r, z, n
        from_hidden = F.linear(state.hidden, gru.weight_hh_l0, gru.bias_hh_l0)  # (B, 3H)
        reset, update = (from_input[:, :2 * width] + from_hidden[:, :2 * width]).sigmoid().chunk(2, dim=1)
        candidate = torch.tanh(from_input[:, 2 * width:] + reset * from_hidden[:, 2 * width:])
        state.hidden.sub_(candidate).mul_(update).add_(candidate)  # h = n + z * (h - n), in place
        return self.out(state.hidden)
