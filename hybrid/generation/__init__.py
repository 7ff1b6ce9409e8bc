"""Generation: search strategies over any decoding state."""

from hybrid.generation.engine import generate

__all__ = ["generate"]
