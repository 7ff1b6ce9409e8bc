"""T2R: the learned feature map of "Finetuning Pretrained Transformers into RNNs" (Kasai et al., 2021).

Linear attention whose feature map is one learned layer per head, phi(x) = relu(W x + b), applied
to the (rotated) queries and keys. Everything else is the attention layer's: ``hybrid convert``
from an attention layer keeps its Q/K/V/output weights bit for bit and initialises only W and b,
and a short fine-tune teaches the feature map to stand in for the softmax.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hybrid.mixers.linear import LinearAttentionMixer
from hybrid.mixers.ssru import ScanOptions
from hybrid.validators import check_int


@dataclasses.dataclass(frozen=True)
class T2ROptions(ScanOptions):
    """``feature_size``: r, the learned features per head (Kasai et al. use 32); ``chunk_size`` as for
    the other scans."""

    feature_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("feature_size", self.feature_size, at_least=1)


class T2RMixer(LinearAttentionMixer):
    """Causal linear attention with a learned relu feature map of ``feature_size`` per head."""

    Options = T2ROptions

    def __init__(self, config, options: T2ROptions) -> None:
        super().__init__(config, options)
        self._features = options.feature_size
        bound = 1.0 / math.sqrt(self.head_dim)  # nn.Linear's default initialisation, per head
        self.feature_weight = nn.Parameter(torch.empty(self.n_heads, self._features, self.head_dim).uniform_(
            -bound, bound))
        self.feature_bias = nn.Parameter(torch.empty(self.n_heads, self._features).uniform_(-bound, bound))

    @property
    def feature_size(self) -> int:
        return self._features

    def feature_map(self, x: Tensor) -> Tensor:
        """phi: (B, nh, T, hd) -> (B, nh, T, r) = relu(W_h x + b_h), one (W_h, b_h) per head."""
        return F.relu(torch.einsum("bhtd,hrd->bhtr", x, self.feature_weight) + self.feature_bias[:, None])
