"""Early, explicit checks of user input: a clear ValueError instead of an IndexError deep in torch."""

from __future__ import annotations

import torch
from torch import Tensor


def check_token_ids(name: str, ids: object, vocab_size: int, ndim: int) -> Tensor:
    """Require an integer tensor of rank ``ndim`` with every id in ``[0, vocab_size)``."""
    if not isinstance(ids, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{name} must hold integer token ids (torch.long), got dtype {ids.dtype}")
    if ids.dim() != ndim:
        shape = "[batch, length]" if ndim == 2 else "[batch]"
        raise ValueError(f"{name} must have shape {shape}, got {tuple(ids.shape)}")
    if ids.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(ids.shape)})")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"{name} contains id {bad}; ids must lie in [0, vocab_size={vocab_size})")
    return ids.long()


def source_mask(src_ids: Tensor, src_mask: object, pad_id: int) -> Tensor:
    """The boolean mask of real source tokens: ``src_mask`` if given (bool or 0/1), else ``src_ids != pad_id``."""
    if src_mask is None:
        mask = src_ids != pad_id
    else:
        if not isinstance(src_mask, Tensor):
            raise TypeError(f"src_mask must be a torch.Tensor, got {type(src_mask).__name__}")
        if src_mask.shape != src_ids.shape:
            raise ValueError(
                f"src_mask has shape {tuple(src_mask.shape)} but src_ids has shape {tuple(src_ids.shape)}; "
                "they must match")
        if src_mask.dtype != torch.bool:
            if src_mask.is_floating_point() or bool(((src_mask != 0) & (src_mask != 1)).any()):
                raise ValueError("src_mask must be bool, or integers that are 0 (padding) or 1 (token)")
            src_mask = src_mask.bool()
        mask = src_mask.to(src_ids.device)
    empty = ~mask.any(dim=1)
    if bool(empty.any()):
        rows = empty.nonzero().flatten().tolist()
        raise ValueError(f"source rows {rows} are all padding; every source needs at least one token")
    return mask


def check_length(name: str, value: object, limit: int, limit_name: str) -> int:
    """Require an int in ``[1, limit]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 1 <= value <= limit:
        raise ValueError(f"{name} must be in [1, {limit_name}={limit}], got {value}")
    return value
