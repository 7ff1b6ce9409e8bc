"""Building blocks shared by the encoder, the decoder and the mixers.

Attention everywhere goes through ``F.scaled_dot_product_attention`` so that PyTorch
picks the fastest kernel for the device (flash / memory-efficient on a GPU, the fused
CPU kernel otherwise). Positions are rotary: they are relative by construction, so a
left- or right-padded source attends the same way, and nothing is learned per position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RotaryEmbedding(nn.Module):
    """Rotary position tables (RoFormer, GPT-NeoX "rotate half" layout) up to ``max_positions``."""

    def __init__(self, head_dim: int, max_positions: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (L, hd/2)
        angles = torch.cat([angles, angles], dim=-1)  # (L, hd)
        # Derived from the config, so not saved: checkpoints stay small and exact.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        """Rotate ``x`` (B, T, ..., hd) as if its first position (dimension 1) were ``start``.

        ``start`` may be a device tensor, 0-d or one position per row (B,), so that a captured
        CUDA graph can replay the same kernels at every position, and rows of one batch can
        be at different positions (continuous refill).
        """
        length = x.shape[1]
        if isinstance(start, Tensor):  # (), or (B,) when every row is at its own position
            positions = (start.view(-1, 1) + torch.arange(length, device=start.device)).flatten()
            cos, sin = self.cos.index_select(0, positions), self.sin.index_select(0, positions)
            rows = start.numel()
        else:
            cos, sin = self.cos[start:start + length], self.sin[start:start + length]  # (T, hd)
            rows = 1
        broadcast = (rows, length) + (1,) * (x.dim() - 3) + (x.shape[-1],)  # (1 or B, T, 1, ..., hd)
        cos, sin = cos.view(broadcast).to(x.dtype), sin.view(broadcast).to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin


def project_qkv(qkv: Tensor, n_heads: int, rotary: RotaryEmbedding, start: int | Tensor = 0):
    """Fused projection (B, T, 3D) -> rotated q, k and v, each (B, nh, T, hd).

    Queries and keys are rotated together, in one pass, because at decode time every
    small op costs more in overhead than in arithmetic.
    """
    batch, length, width = qkv.shape
    qkv = qkv.view(batch, length, 3, n_heads, width // (3 * n_heads))  # (B, T, 3, nh, hd)
    qk = rotary(qkv[:, :, :2], start)  # (B, T, 2, nh, hd)
    q, k = qk.unbind(dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), qkv[:, :, 2].transpose(1, 2)


class FeedForward(nn.Module):
    """Position-wise MLP: Linear -> GELU -> Linear."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc_out(F.gelu(self.fc_in(x))))


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, T, D) -> (B, nh, T, hd)."""
    batch, length, width = x.shape
    return x.view(batch, length, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, nh, T, hd) -> (B, T, D)."""
    batch, n_heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, n_heads * head_dim)


class EncoderSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention that ignores padded source positions."""

    def __init__(self, d_model: int, n_heads: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.rotary = RotaryEmbedding(d_model // n_heads, max_positions)
        self.dropout = dropout

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        """x: (B, S, D); key_mask: (B, 1, 1, S) bool, True on real tokens."""
        q, k, v = project_qkv(self.qkv(x), self.n_heads, self.rotary)  # 3 x (B, nh, S, hd)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=key_mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out(merge_heads(y))


class CrossAttention(nn.Module):
    """Decoder-to-encoder attention, always kept in every decoder layer.

    The keys and values depend only on the encoder output, so decoding projects them
    once per source (:meth:`project_memory`) and reuses them at every step.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def project_memory(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """memory (B, S, D) -> keys, values, each (B, nh, S, hd)."""
        keys, values = self.key_value(memory).chunk(2, dim=-1)
        return split_heads(keys, self.n_heads), split_heads(values, self.n_heads)

    def forward(self, x: Tensor, keys: Tensor, values: Tensor, key_mask: Tensor) -> Tensor:
        """x: (B, T, D) queries; keys/values: (B, nh, S, hd); key_mask: (B, 1, 1, S)."""
        q = split_heads(self.query(x), self.n_heads)  # (B, nh, T, hd)
        # The mask spelled out over the queries (a view): ONNX Runtime's Attention operator, which the
        # fast path exports this call to, does not broadcast the mask's query dimension.
        mask = key_mask.expand(-1, -1, q.shape[2], -1)
        y = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return self.out(merge_heads(y))
