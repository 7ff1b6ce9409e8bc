"""Causal linear attention (Katharopoulos et al., 2020, "Transformers are RNNs").

Softmax(q k^T) is replaced by a kernel phi(q) phi(k)^T with phi(x) = elu(x) + 1, so

    y_t = phi(q_t)^T S_t / (phi(q_t)^T z_t),   S_t = sum_{s<=t} phi(k_s) v_s^T,   z_t = sum_{s<=t} phi(k_s)

and a step carries (S, z) per head: a fixed size, whatever the length. Queries and keys are
projected and rotated exactly as in the attention mixer (same ``qkv``/``out`` layers, rotary
positions), which is what lets ``hybrid convert`` keep a trained attention layer's weights.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.layers import merge_heads, project_qkv, rotation
from hybrid.mixers.base import Mixer, MixerState, Position
from hybrid.mixers.ssru import ScanOptions

_EPSILON = 1e-6  # keeps the normaliser positive; phi > 0 makes it so in exact arithmetic


def causal_linear_attention(q: Tensor, k: Tensor, v: Tensor, chunk_size: int) -> Tensor:
    """Causal linear attention over features ``q``, ``k`` (B, nh, T, r), all >= 0, and values ``v`` (B, nh, T, hd).

    Chunk by chunk: within a chunk, the masked (C, C) products; from earlier chunks, the running
    sums S (r, hd) and z (r,). Memory is O(C^2 + r hd) per head, never O(T^2).
    """
    batch, heads, length, features = q.shape
    sums = q.new_zeros(batch, heads, features, v.shape[-1])  # S
    normalisers = q.new_zeros(batch, heads, features, 1)  # z
    outputs = []
    for start in range(0, length, chunk_size):
        qc, kc, vc = (t[:, :, start:start + chunk_size] for t in (q, k, v))  # (B, nh, C, .)
        size = qc.shape[2]
        causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        scores = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0)  # (B, nh, C, C)
        numerator = scores @ vc + qc @ sums  # (B, nh, C, hd)
        denominator = scores.sum(dim=-1, keepdim=True) + qc @ normalisers  # (B, nh, C, 1)
        outputs.append(numerator / (denominator + _EPSILON))
        sums = sums + kc.transpose(-1, -2) @ vc
        normalisers = normalisers + kc.sum(dim=2)[..., None]
    return torch.cat(outputs, dim=2)


@dataclasses.dataclass
class LinearAttentionState(MixerState):
    """The running sums of one layer: S = sum phi(k) v^T and z = sum phi(k), per head."""

    sums: Tensor  # (B, nh, r, hd)
    normalisers: Tensor  # (B, nh, r)


class LinearAttentionMixer(Mixer):
    """Multi-head causal linear attention with the feature map elu(x) + 1."""

    Options = ScanOptions
    # Attention and every linear attention project and merge heads with the same layers.
    carried_over = {name: ("qkv", "out") for name in ("attention", "linear", "t2r", "performer")}

    def __init__(self, config, options: ScanOptions) -> None:
        super().__init__()
        self.n_heads, self.head_dim, self.chunk_size = config.n_heads, config.head_dim, options.chunk_size
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)  # as AttentionMixer's: convert copies them
        self.out = nn.Linear(config.d_model, config.d_model)
        self.rotary = rotation(config)

    @property
    def feature_size(self) -> int:
        return self.head_dim

    def feature_map(self, x: Tensor) -> Tensor:
        """phi: (B, nh, T, hd) -> (B, nh, T, r), every entry > 0."""
        return F.elu(x) + 1.0

    def query_feature_map(self, q: Tensor) -> Tensor:
        """phi of the queries: ``feature_map``. A subclass may scale each query's features by a factor of
        its own, which its output does not see (it cancels between numerator and denominator)."""
        return self.feature_map(q)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = project_qkv(self.qkv(x), self.n_heads, self.rotary, 0)  # 3 x (B, nh, T, hd)
        y = causal_linear_attention(self.query_feature_map(q), self.feature_map(k), v, self.chunk_size)
        return self.out(merge_heads(y))

    def allocate_state(self, batch_size: int, max_steps: int, device, dtype) -> LinearAttentionState:
        shape = (batch_size, self.n_heads, self.feature_size)
        return LinearAttentionState(sums=torch.zeros(*shape, self.head_dim, device=device, dtype=dtype),
                                    normalisers=torch.zeros(shape, device=device, dtype=dtype))

    def step(self, x: Tensor, state: LinearAttentionState, position: Position) -> Tensor:
        # Rotary positions need the position; a (B,) one rotates each row by its own.
        start = position.expand(x.shape[0]) if isinstance(position, Tensor) else position
        q, k, v = project_qkv(self.qkv(x.unsqueeze(1)), self.n_heads, self.rotary, start)  # 3 x (B, nh, 1, hd)
        q, k = self.query_feature_map(q).squeeze(2), self.feature_map(k).squeeze(2)  # (B, nh, r)
        state.sums.add_(k[..., :, None] * v)  # v: (B, nh, 1, hd) broadcasts over r
        state.normalisers.add_(k)
        numerator = (q[..., None, :] @ state.sums).squeeze(2)  # (B, nh, hd)
        denominator = (q * state.normalisers).sum(dim=-1, keepdim=True)  # (B, nh, 1)
        y = numerator / (denominator + _EPSILON)
        return self.out(y.reshape(x.shape[0], -1))  # heads merged: (B, D)
