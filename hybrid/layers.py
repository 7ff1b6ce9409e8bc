"""Building blocks shared by the encoder, the decoder and the mixers.

Attention everywhere goes through ``F.scaled_dot_product_attention`` so that PyTorch
picks the fastest kernel for the device (flash / memory-efficient on a GPU, the fused
CPU kernel otherwise). Hybrid's own positions are rotary: they are relative by construction,
so a left- or right-padded source attends the same way, and nothing is learned per position.
An imported model adds a table of positions to its embeddings instead (:class:`PositionTable`).

Each architectural variant of :class:`hybrid.ModelConfig` is one small piece here, chosen once
per model: :func:`rotation` (rotary or none), :func:`position_table`, :func:`residual`
(pre- or post-norm) and :data:`ACTIVATIONS`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

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


class NoRotation(nn.Module):
    """The rotation of a model whose positions are a table added to its embeddings: none."""

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        return x


def rotation(config) -> nn.Module:
    """What a self-attention does to its queries and keys for positions: rotate them, or nothing."""
    if config.positions == "rotary":
        return RotaryEmbedding(config.head_dim, config.max_positions)
    return NoRotation()


class PositionTable(nn.Module):
    """A table of position vectors added to the embeddings; position p reads row p + ``offset``.

    ``learned`` makes it a parameter (BART); otherwise it is a fixed sinusoid table (Marian, M2M100),
    a buffer that is saved with the weights, so an imported table is kept exactly, whichever of the
    sinusoid formulas its family used.
    """

    def __init__(self, positions: int, width: int, offset: int, learned: bool) -> None:
        super().__init__()
        self.offset = offset
        table = sinusoids(positions + offset, width)
        if learned:
            self.weight = nn.Parameter(table.normal_(std=0.02))
        else:
            self.register_buffer("weight", table)

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        """Add positions to ``x``: (B, T, D) from position ``start`` on, or one step (B, D) at ``start``.

        ``start`` is an int, a 0-d tensor or one position per row (B,), as for :class:`RotaryEmbedding`.
        """
        if x.dim() == 2:  # one decoding step
            return x + self.weight[start + self.offset]  # (D,), or (B, D) for one position per row
        steps = torch.arange(x.shape[1], device=x.device) + self.offset
        positions = start.view(-1, 1) + steps if isinstance(start, Tensor) else steps + start  # (T,) or (B, T)
        return x + self.weight[positions]


class NoPositionTable(nn.Module):
    """The position table of a model with rotary positions: nothing is added."""

    def forward(self, x: Tensor, start: int | Tensor = 0) -> Tensor:
        return x


def position_table(config) -> nn.Module:
    """The table an embedding adds for positions, or none (rotary positions live in the attention)."""
    if config.positions == "rotary":
        return NoPositionTable()
    return PositionTable(config.max_positions, config.d_model, config.position_offset,
                         learned=config.positions == "learned")


def sinusoids(length: int, width: int, interleaved: bool = False) -> Tensor:
    """Vaswani et al.'s encodings (length, width): sin(t / 10000^(2i/width)) and cos(.), the sines in the
    first half of each row and the cosines in the second (Marian's layout), or taking turns
    (``interleaved``: PE[t, 2i] = sin, PE[t, 2i+1] = cos, as the paper writes them)."""
    angles = torch.arange(length, dtype=torch.float32)[:, None] / 10000.0 ** (
        torch.arange(0, width, 2, dtype=torch.float32) / width)  # (length, ceil(width/2))
    if not interleaved:
        return torch.cat([angles.sin(), angles.cos()[:, :width // 2]], dim=-1)
    table = torch.zeros(length, width)
    table[:, 0::2], table[:, 1::2] = angles.sin(), angles.cos()[:, :width // 2]
    return table


def pre_norm(x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """x + f(norm(x)): the norm on the sublayer's input."""
    return x + sublayer(norm(x))


def post_norm(x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
    """norm(x + f(x)): the norm on the residual sum (BART, Marian)."""
    return norm(x + sublayer(x))


def residual(config) -> Callable[[Tensor, nn.Module, Callable[[Tensor], Tensor]], Tensor]:
    """How every sublayer of the model joins its residual stream."""
    return pre_norm if config.pre_norm else post_norm


# The feed-forward's activation, by ModelConfig.activation.
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu, "gelu_tanh": functools.partial(F.gelu, approximate="tanh"), "relu": F.relu, "silu": F.silu}


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
    """Position-wise MLP: Linear -> activation (GELU by default) -> Linear."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str = "gelu") -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, d_ff)
        self.fc_out = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc_out(self.activation(self.fc_in(x))))


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, T, D) -> (B, nh, T, hd)."""
    batch, length, width = x.shape
    return x.view(batch, length, n_heads, width // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, nh, T, hd) -> (B, T, D)."""
    batch, n_heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, n_heads * head_dim)


def over_queries(key_mask: Tensor, queries: Tensor) -> Tensor:
    """A key mask (B, 1, 1, S) spelled out over the queries (B, nh, T, hd) as (B, 1, T, S), a view: ONNX
    Runtime's Attention operator, which the fast path exports attention to, does not broadcast the mask's
    query dimension."""
    return key_mask.expand(-1, -1, queries.shape[2], -1)


class EncoderSelfAttention(nn.Module):
    """Bidirectional multi-head self-attention that ignores padded source positions."""

    def __init__(self, config) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)
        self.rotary = rotation(config)
        self.dropout = config.dropout

    def forward(self, x: Tensor, key_mask: Tensor) -> Tensor:
        """x: (B, S, D); key_mask: (B, 1, 1, S) bool, True on real tokens."""
        q, k, v = project_qkv(self.qkv(x), self.n_heads, self.rotary)  # 3 x (B, nh, S, hd)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=over_queries(key_mask, q), dropout_p=self.dropout if self.training else 0.0)
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
        y = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=over_queries(key_mask, q), dropout_p=self.dropout if self.training else 0.0)
        return self.out(merge_heads(y))
