"""The physical floor of a decode step: the bytes it must read, over the machine's memory bandwidth.

A step cannot be faster than reading, once, the decoder weights it multiplies by and the
decoding state it attends over or updates (../shared/BENCHMARKING.md, "Limits worth
computing"). :class:`StepReads` holds those bytes for one contender, derived from its model's
modules and state classes rather than typed in, so every registered mixer gets a floor; the
runner divides them by the bandwidth it measures once per run. Where a step's bytes fit in the
last-level cache (:func:`last_level_cache_bytes`), they need not come from memory at all, and
the floor bounds nothing: the headline judges no such row against it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from hybrid.model import Seq2Seq

if TYPE_CHECKING:
    from transformers import BartForConditionalGeneration


# A server CPU's last-level cache is tens of MiB: the size assumed where the machine does not say.
ASSUMED_CACHE_BYTES = 32 * 2**20


def last_level_cache_bytes(device: torch.device) -> int:
    """The size of ``device``'s last-level cache: a GPU's L2, a CPU's highest-level data cache as Linux
    lists it (``/sys/devices/system/cpu/cpu0/cache``), else :data:`ASSUMED_CACHE_BYTES`."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size
    caches = {}
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip()  # e.g. "32768K"
                units = {"K": 2**10, "M": 2**20, "G": 2**30}
                bytes_ = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
                caches[int((index / "level").read_text())] = bytes_
        except (OSError, ValueError):
            continue
    return caches[max(caches)] if caches else ASSUMED_CACHE_BYTES


@dataclasses.dataclass(frozen=True)
class StepReads:
    """The bytes one decode step reads, split by how they scale with a cell's shape.

    ``weights`` are read once per step whatever the batch. Each row adds the cross-attention
    keys/values of its memory (``memory_per_position`` bytes per source position), a fixed-size
    mixer state (``state``: the LSTM's ``(h, c)``) and a cache that grows by
    ``state_per_position`` bytes with every position decoded (the KV cache).
    """

    weights: int
    memory_per_position: int
    state: int = 0
    state_per_position: int = 0

    def state_bytes(self, batch: int, source_length: int, steps: float) -> float:
        """Bytes of the decoding state of ``batch`` rows once ``steps`` tokens are fed: memory plus mixer state."""
        per_row = self.memory_per_position * source_length + self.state + self.state_per_position * steps
        return batch * per_row

    def per_step(self, batch: int, source_length: int, new_tokens: int) -> float:
        """Mean bytes read by one of the ``new_tokens`` steps of a (batch, source length) cell."""
        # Step p (from 0) reads the state as it stands after p + 1 tokens, which is linear in p,
        # so its mean over the N steps is the state after (N + 1) / 2 tokens.
        return self.weights + self.state_bytes(batch, source_length, (new_tokens + 1) / 2)


def seq2seq_reads(model: Seq2Seq, int8: bool = False) -> StepReads:
    """What one :meth:`Seq2Seq.step` reads: every decoder layer's mixer, cross-attention query and
    output projections, FFN and norms, the final norm, the head and one embedding row, plus its state.

    Not the encoder, and not the cross-attention key/value projections, which run once per source
    in :meth:`Seq2Seq.start`. The mixer state is sized by each mixer's own ``allocate_state`` on the
    meta device (so nothing is allocated) for one and two steps: what a state gains per step is a
    cache that a step reads up to its position; the rest is read whole at every step.

    ``int8`` counts what the fast path's int8 quantization stores (ONNX Runtime's ``quantize_dynamic``:
    the weight of every matrix product at one byte an element and one float32 scale per tensor; norms,
    biases and the embedding row a step looks up stay float).
    """
    layers = model.decoder_layers
    once_per_source = {id(p) for layer in layers for p in layer.cross.key_value.parameters()}
    read = {id(p): p for part in (layers, model.decoder_norm, model.lm_head) for p in part.parameters()}
    element = model.embed.weight.element_size()
    def nbytes(p: torch.Tensor) -> int:
        return p.numel() + 4 if int8 and p.dim() == 2 else p.numel() * p.element_size()

    weights = sum(nbytes(p) for key, p in read.items() if key not in once_per_source)
    memory = sum(layer.cross.key_value.out_features for layer in layers) * element

    def mixer_bytes(steps: int) -> int:
        with torch.inference_mode():  # like Seq2Seq.start: the LSTM fuses its weights for stepping here
            return sum(layer.mixer.allocate_state(1, steps, torch.device("meta"), model.embed.weight.dtype).nbytes
                       for layer in layers)

    growth = mixer_bytes(2) - mixer_bytes(1)
    return StepReads(weights + model.embed.embedding_dim * element, memory, mixer_bytes(1) - growth, growth)


def bart_reads(model: BartForConditionalGeneration, float_bytes: int, int8: bool = False) -> StepReads:
    """What one step of a transformers ``BartForConditionalGeneration``'s decoder reads, its float
    tensors at ``float_bytes`` each: self-attention, cross-attention query and output projections,
    FFN, norms, the head, one row of each embedding table, plus its KV cache and cross keys/values.

    ``int8`` counts the tensors CTranslate2 quantizes (every variable it names ``weight``: the
    weight of each linear layer, the head included, and the token embedding; not the position
    table, the norms or the biases) at one byte an element plus a float32 scale per row.
    """
    decoder = model.get_decoder()
    once_per_source = [m for layer in decoder.layers for m in (layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)]
    tables = [decoder.embed_tokens, decoder.embed_positions]  # one row each per step

    def nbytes(module: nn.Module, name: str, tensor: torch.Tensor) -> int:
        if int8 and name == "weight" and (isinstance(module, nn.Linear) or module is decoder.embed_tokens):
            return tensor.numel() + 4 * tensor.shape[0]
        return tensor.numel() * float_bytes

    skipped = once_per_source + tables
    modules = [m for m in [*decoder.modules(), model.lm_head] if not any(m is skip for skip in skipped)]
    weights = sum(nbytes(m, name, p) for m in modules for name, p in m.named_parameters(recurse=False))
    weights += sum(nbytes(table, "weight", table.weight[:1]) for table in tables)

    def keys_values(attention: nn.Module) -> int:  # bytes per position of one row
        return (attention.k_proj.out_features + attention.v_proj.out_features) * float_bytes

    return StepReads(weights, sum(keys_values(layer.encoder_attn) for layer in decoder.layers),
                     state_per_position=sum(keys_values(layer.self_attn) for layer in decoder.layers))
