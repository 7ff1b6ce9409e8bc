"""Performer: FAVOR+ linear attention (Choromanski et al., 2021, "Rethinking Attention with Performers").

Linear attention whose feature map estimates softmax attention's kernel without bias: with
x = q / hd^(1/4) (so that phi(q) . phi(k) estimates exp(q . k / sqrt(hd)), the kernel of
scaled dot-product attention),

    phi(x) = exp(W x - |x|^2 / 2) / sqrt(m)

where W (m, hd) holds positive orthogonal random features: stacked blocks of hd x hd random
orthogonal matrices, each row rescaled to the norm of an independent Gaussian vector. W is drawn,
not learned: a buffer saved with the model, redrawn every ``redraw_interval`` training calls and
fixed for evaluation and decoding. Everything else is the attention layer's, so ``hybrid convert``
from attention keeps its Q/K/V/output weights bit for bit, and the converted layer approximates
the attention it replaces before any fine-tuning, the better the more features.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from hybrid.mixers.linear import LinearAttentionMixer
from hybrid.mixers.ssru import ScanOptions
from hybrid.validators import check_int

# A key's exponent w.x - |x|^2/2 is at most |w|^2/2 whatever the key (at x = w), and |w|^2 is about hd:
# about 50 at most for 64-wide heads, whose features then stay below e^50 ~ 5e21 and leave float32 a
# factor e^38 for the sums over positions and values. The clamp keeps that bound for wider heads too;
# it only ever touches a key aligned with one long row of W, whose weight would swamp the others anyway.
_MAX_KEY_EXPONENT = 50.0


@dataclasses.dataclass(frozen=True)
class PerformerOptions(ScanOptions):
    """``feature_size``: m, the random features per head (None: twice the head width); more features
    approximate softmax attention more closely, and the state holds m x head width numbers per head.
    ``redraw_interval``: training forward calls between fresh draws of the features (None: never;
    1000 is performer-pytorch's default); evaluation and decoding never redraw. ``chunk_size`` as for
    the other scans."""

    feature_size: int | None = None
    redraw_interval: int | None = 1000

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("feature_size", self.feature_size, at_least=1, optional=True)
        check_int("redraw_interval", self.redraw_interval, at_least=1, optional=True)


def orthogonal_random_features(features: int, width: int) -> Tensor:
    """W (features, width) from the global RNG: rows orthogonal within each block of ``width`` rows, and
    each row as long as an independent Gaussian vector (chi-distributed norms), so that every row is
    marginally Gaussian, as the estimator's unbiasedness needs, while a block's rows stay orthogonal."""
    blocks = []
    for _ in range(math.ceil(features / width)):
        orthogonal, _ = torch.linalg.qr(torch.randn(width, width))
        blocks.append(orthogonal.T)
    norms = torch.randn(features, width).norm(dim=1, keepdim=True)  # (m, 1)
    return torch.cat(blocks)[:features] * norms


class PerformerMixer(LinearAttentionMixer):
    """Causal linear attention with FAVOR+ positive orthogonal random features, ``feature_size`` per head."""

    Options = PerformerOptions

    def __init__(self, config, options: PerformerOptions) -> None:
        super().__init__(config, options)
        self._features = 2 * self.head_dim if options.feature_size is None else options.feature_size
        self.redraw_interval = options.redraw_interval
        self._calls_since_redraw = 0
        # One draw shared by every head, as in the paper's code; a buffer, so a saved model (and its
        # exported step) decodes with the very features it was trained or converted with.
        self.register_buffer("projection", orthogonal_random_features(self._features, self.head_dim))

    @property
    def feature_size(self) -> int:
        return self._features

    def _exponents(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """W x for x = input / hd^(1/4): (B, nh, T, hd) -> (B, nh, T, m), and x itself."""
        x = x * self.head_dim ** -0.25
        return x @ self.projection.T, x

    def feature_map(self, x: Tensor) -> Tensor:
        """phi(x) = exp(W x - |x|^2/2) / sqrt(m) for keys: (B, nh, T, hd) -> (B, nh, T, m).

        A key gets no data-dependent stabiliser: a per-key constant would reweight it against the others,
        and one shared by all keys (the reference code's max over the sequence) would let a position see
        later keys. The |x|^2/2 term and the clamp keep it finite instead (see ``_MAX_KEY_EXPONENT``)."""
        projected, x = self._exponents(x)
        exponents = projected - x.square().sum(dim=-1, keepdim=True) / 2
        return exponents.clamp(max=_MAX_KEY_EXPONENT).exp() / math.sqrt(self._features)

    def query_feature_map(self, q: Tensor) -> Tensor:
        """phi(q) up to a factor per query, exp(W x - max W x): the factor cancels in the query's output, and
        this one makes the largest feature 1, so none overflows, they cannot all vanish, and the normaliser
        sits well clear of the scan's epsilon. (exp(-|x|^2/2) / sqrt(m) is such a factor too, so it goes.)"""
        projected, _ = self._exponents(q)
        return (projected - projected.amax(dim=-1, keepdim=True).detach()).exp()

    def forward(self, x: Tensor) -> Tensor:
        if self.training and self.redraw_interval is not None:
            # Fresh features now and then keep training from fitting one draw's errors.
            if self._calls_since_redraw == self.redraw_interval:
                self.projection.copy_(orthogonal_random_features(self._features, self.head_dim))
                self._calls_since_redraw = 0
            self._calls_since_redraw += 1
        return super().forward(x)
