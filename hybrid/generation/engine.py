"""``generate``: decode a batch of sources with any model that offers ``start``/``step``."""

from __future__ import annotations

import torch
from torch import Tensor

from hybrid.generation.sessions import CachedSession, UncachedSession
from hybrid.inputs import check_length, check_token_ids, source_mask


@torch.inference_mode()
def generate(model, src_ids: Tensor, src_mask: Tensor | None = None, max_new_tokens: int = 256,
             use_cache: bool = True, eos_check_interval: int | None = None) -> Tensor:
    """Greedy decoding of ``src_ids`` (B, S); returns (B, L) new ids, EOS included, ``pad_id`` after it.

    Padding and BOS are never generated (as in fairseq): they mark structure, not text.

    Finished sequences leave the working batch (``reorder``), so the work shrinks as they
    end. Checking which sequences finished reads a flag on the host; on a GPU that is a
    synchronisation, so it happens every ``eos_check_interval`` steps (default 1 on CPU,
    8 elsewhere) while the device runs ahead.
    """
    config = model.config
    src_ids = check_token_ids("src_ids", src_ids, config.vocab_size, ndim=2)
    src_mask = source_mask(src_ids, src_mask, config.pad_id)
    check_length("max_new_tokens", max_new_tokens, config.max_positions, "max_positions")
    if eos_check_interval is None:
        eos_check_interval = 1 if src_ids.device.type == "cpu" else 8
    check_length("eos_check_interval", eos_check_interval, max_new_tokens, "max_new_tokens")

    session_class = CachedSession if use_cache else UncachedSession
    session = session_class(model, src_ids, src_mask, max_new_tokens)
    batch, device = src_ids.shape[0], src_ids.device
    output = torch.full((batch, max_new_tokens), config.pad_id, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)  # the original row of each working row
    tokens = torch.full((batch,), config.bos_id, dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    never_generate = torch.tensor(sorted({config.pad_id, config.bos_id} - {config.eos_id}), device=device)
    length = 0
    for position in range(max_new_tokens):
        logits = session.step(tokens).index_fill_(1, never_generate, float("-inf"))  # (b, vocab)
        tokens = logits.argmax(dim=-1).masked_fill(finished, config.pad_id)  # (b,)
        output[rows, position] = tokens
        finished |= tokens == config.eos_id
        length = position + 1
        if length % eos_check_interval == 0 or length == max_new_tokens:
            keep = (~finished).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            if keep.numel() < rows.numel():
                session.reorder(keep)
                rows, tokens, finished = rows[keep], tokens[keep], finished[keep]
    return output[:, :length]
