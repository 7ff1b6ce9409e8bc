"""Causal multi-head self-attention with a key/value cache grown in capacity buckets: the baseline mixer."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.layers import merge_heads, project_qkv, rotation
from hybrid.mixers.base import Mixer, MixerState, Position


@dataclasses.dataclass
class KVCache(MixerState):
    """Keys and values of every past position, allocated once for the whole decode."""

    steps_dim = 2

    keys: Tensor  # (B, nh, max_steps, hd)
    values: Tensor  # (B, nh, max_steps, hd)


class AttentionMixer(Mixer):
    """Causal self-attention (SDPA; rotary positions, or none when the model adds a table of them).
    Step mode writes into a KV cache allocated in capacity buckets that double as the decode goes on
    (:meth:`hybrid.state.DecodeState.reserve`), so nothing is concatenated per step; its memory and the
    work of every step still grow linearly with the length decoded, which is the cost the LSTM mixer removes."""

    constant_state = False

    def __init__(self, config, options: Mixer.Options) -> None:
        super().__init__()
        self.n_heads, self.head_dim = config.n_heads, config.head_dim
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)
        self.rotary = rotation(config)
        self.dropout = config.dropout

    def _project(self, x: Tensor, start: int | Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return project_qkv(self.qkv(x), self.n_heads, self.rotary, start)  # 3 x (B, nh, T, hd)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = self._project(x, start=0)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.out(merge_heads(y))

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> KVCache:
        shape = (batch_size, self.n_heads, max_steps, self.head_dim)
        return KVCache(keys=torch.zeros(shape, device=device, dtype=dtype),
                       values=torch.zeros(shape, device=device, dtype=dtype))

    def step(self, x: Tensor, state: KVCache, position: Position) -> Tensor:
        if isinstance(position, Tensor):
            return self._shape_static_step(x, state, position)
        q, k, v = self._project(x.unsqueeze(1), start=position)  # 3 x (B, nh, 1, hd)
        state.keys[:, :, position] = k.squeeze(2)
        state.values[:, :, position] = v.squeeze(2)
        # Every cached position is a real token (decoding advances all rows together),
        # so the prefix needs no mask.
        y = F.scaled_dot_product_attention(
            q, state.keys[:, :, :position + 1], state.values[:, :, :position + 1])  # (B, nh, 1, hd)
        return self.out(merge_heads(y)).squeeze(1)

    def _shape_static_step(self, x: Tensor, state: KVCache, position: Tensor) -> Tensor:
        """The step with ``position`` on the device: no shape depends on it, so a CUDA graph can replay it.

        ``position`` is 0-d, or (B,) when rows sit at different positions (a slot-indexed
        cache that finished rows hand to new sources). It attends over the whole
        allocated cache with a mask of each row's filled positions, trading O(capacity)
        work per step for launch-free replay and per-row positions.
        """
        positions = position.expand(x.shape[0])  # (B,): one shared position, or one per row
        q, k, v = self._project(x.unsqueeze(1), start=positions)  # 3 x (B, nh, 1, hd)
        # Each row's (heads, head_dim) block at its position: ONNX's ScatterND writes those blocks whole, where
        # scatter_ along the positions (ScatterElements) indexed every element and cost ~5x as much per step.
        rows = torch.arange(x.shape[0], device=x.device)[:, None]
        heads = torch.arange(k.shape[1], device=x.device)[None, :]
        state.keys.index_put_((rows, heads, positions[:, None]), k.squeeze(2))
        state.values.index_put_((rows, heads, positions[:, None]), v.squeeze(2))
        filled = torch.arange(state.keys.shape[2], device=x.device) <= positions[:, None]  # (B, max_steps)
        y = F.scaled_dot_product_attention(q, state.keys, state.values, attn_mask=filled[:, None, None, :])
        return self.out(merge_heads(y)).squeeze(1)  # (B, D)
