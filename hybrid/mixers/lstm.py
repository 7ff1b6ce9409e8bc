"""The LSTM mixer: a fixed-size recurrent state replaces the decoder's self-attention."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.mixers.base import Mixer, MixerOptions, MixerState, Position
from hybrid.validators import check_bool, check_float, check_int


@dataclasses.dataclass
class LSTMState(MixerState):
    """``(h, c)`` of one LSTM layer. Its size never depends on how many tokens were decoded."""

    hidden: Tensor  # (B, H)
    cell: Tensor  # (B, H)


@dataclasses.dataclass(frozen=True)
class RecurrentOptions(MixerOptions):
    """``hidden_size``: a recurrent mixer's width; None means ``d_model``. An LSTM layer holds about
    8h^2 parameters (and h d for its projection) against 4d^2 for self-attention, so h ~ 0.55 d_model
    matches the attention decoder's parameter count (a GRU: 6h^2 + h d).

    ``output_projection``: a linear map from the width back to ``d_model`` even when they are equal,
    initialised small like every other residual branch's last matrix (attention's output projection).
    Without it the recurrent output (each entry of h up to +-1) enters the residual stream at full scale
    from the first step: on G2P at equal width training was unstable across seeds (PER 0.311 +- 0.060
    over 3 seeds without, 0.254 +- 0.011 with; results/recipe/g2p/). False projects only where the width
    differs, the layout of models saved before the option existed (``ModelConfig.from_saved``)."""

    hidden_size: int | None = None
    output_projection: bool = True

    def __post_init__(self) -> None:
        check_int("hidden_size", self.hidden_size, at_least=1, optional=True)
        check_bool("output_projection", self.output_projection)

    @classmethod
    def from_saved(cls, data: object) -> object:
        # Saved before output_projection existed: an equal-width layer had none.
        return {"output_projection": False, **data} if isinstance(data, dict) else data

    def width(self, d_model: int) -> int:
        return self.hidden_size or d_model

    def projection(self, d_model: int) -> nn.Module:
        """What maps the recurrent output (width) back to ``d_model``."""
        width = self.width(d_model)
        return nn.Linear(width, d_model) if self.output_projection or width != d_model else nn.Identity()


@dataclasses.dataclass(frozen=True)
class LSTMOptions(RecurrentOptions):
    """``forget_bias``: the forget gate's bias at initialisation (Jozefowicz et al., 2015, use 1: a
    layer starts out keeping its cell, so gradients reach back through more steps); None keeps
    PyTorch's uniform(-1/sqrt(h), 1/sqrt(h)), centred on 0, under which a fresh LSTM forgets about
    half its cell each step."""

    forget_bias: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float("forget_bias", self.forget_bias, finite=False, optional=True)


class LSTMMixer(Mixer):
    """One ``nn.LSTM`` layer of width ``options.hidden_size``, projected back to ``d_model`` (see ``RecurrentOptions``).

    Training runs the whole target through one ``nn.LSTM`` call (cuDNN on a GPU). A step
    advances ``(h, c)`` with one fused matrix product ``[x | h] @ [W_ih | W_hh]^T`` and updates
    both in place. (Keeping ``x`` and ``h`` in one buffer would spare the concatenation, but
    writing into part of a buffer costs an exported graph several nodes per layer: see
    :mod:`hybrid.accel.onnx`.)
    """

    Options = LSTMOptions

    def __init__(self, config, options: LSTMOptions) -> None:
        super().__init__()
        self.d_model, self.width = config.d_model, options.width(config.d_model)
        self.lstm = nn.LSTM(config.d_model, self.width, batch_first=True)
        if options.forget_bias is not None:
            with torch.no_grad():  # the gate sees b_ih + b_hh: the first holds the bias, the second none
                forget = slice(self.width, 2 * self.width)  # PyTorch's i, f, g, o order
                self.lstm.bias_ih_l0[forget] = options.forget_bias
                self.lstm.bias_hh_l0[forget] = 0.0
        self.out = options.projection(config.d_model)
        self._fused_weight: Tensor | None = None
        self._fused_bias: Tensor | None = None

    def forward(self, x: Tensor) -> Tensor:
        y, _ = self.lstm(x)  # (B, T, H)
        return self.out(y)

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> LSTMState:
        # The weights do not change while decoding, so fuse them once per decode, not per step.
        lstm = self.lstm
        # (4H, D + H), contiguous: F.linear's matrix-vector product is about twice as fast on it as
        # addmm on the transposed view (measured on the benchmark's CPU).
        self._fused_weight = torch.cat([lstm.weight_ih_l0, lstm.weight_hh_l0], dim=1)
        self._fused_bias = lstm.bias_ih_l0 + lstm.bias_hh_l0  # (4H,)
        return LSTMState(hidden=torch.zeros(batch_size, self.width, device=device, dtype=dtype),
                         cell=torch.zeros(batch_size, self.width, device=device, dtype=dtype))

    def step(self, x: Tensor, state: LSTMState, position: Position) -> Tensor:
        # The recurrence needs no position: every form of it is accepted and unused.
        if self._fused_weight is None:
            raise RuntimeError("LSTMMixer.step called before allocate_state (use Seq2Seq.start)")
        gates = F.linear(torch.cat([x, state.hidden], dim=1), self._fused_weight, self._fused_bias)  # (B, 4H)
        # One sigmoid over all four gates is cheaper than three small ones; g's is unused.
        in_gate, forget_gate, _, out_gate = gates.sigmoid().chunk(4, dim=1)  # PyTorch's i, f, g, o order
        cell_gate = gates[:, 2 * self.width:3 * self.width].tanh()
        state.cell.mul_(forget_gate).addcmul_(in_gate, cell_gate)
        hidden = torch.mul(out_gate, state.cell.tanh(), out=state.hidden)  # written into the state
        return self.out(hidden)
