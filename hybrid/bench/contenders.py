"""The decoders a benchmark run compares, each behind the same two calls: ``prefill`` and ``generate``.

Every contender shares width, depth, heads, FFN size, vocabulary, dtype and device, so
a row differs from another only in how the decoder mixes tokens (or whose code runs it).
A new row is one :class:`Contender` appended in :func:`build_contenders`; :func:`ours`
makes one for any :class:`Seq2Seq` and a way of driving it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import Tensor

from hybrid.bench.floor import StepReads, bart_reads, seq2seq_reads
from hybrid.config import ModelConfig
from hybrid.mixers import MIXERS
from hybrid.model import Seq2Seq


@dataclasses.dataclass
class Contender:
    """One row family of the benchmark: a model and the way it is driven."""

    name: str
    parameters: int
    prefill: Callable[[Tensor], object]  # encoder + cross-attention keys/values (+ state allocation)
    generate: Callable[[Tensor, int], Tensor]  # greedy: (batch, N) new token ids, no start token
    state_bytes: Callable[[int, int, int], int]  # (batch, source_length, new_tokens) -> bytes
    step_reads: StepReads  # the bytes a decode step reads: its floor
    max_new_tokens: int | None = None  # longer cells are skipped (the uncached loop is quadratic)
    model: torch.nn.Module | None = None
    max_batch: int | None = None  # wider cells are skipped


def model_config(shape: dict, mixers: str | list[str], lstm_hidden_size: int | None = None) -> ModelConfig:
    return ModelConfig(vocab_size=shape["vocab_size"], d_model=shape["d_model"], n_heads=shape["n_heads"],
                       d_ff=shape["d_ff"], encoder_layers=shape["encoder_layers"],
                       decoder_layers=shape["decoder_layers"], decoder_mixers=mixers, dropout=0.0,
                       max_positions=shape["max_positions"], lstm_hidden_size=lstm_hidden_size)


def parameter_matched_lstm_width(shape: dict) -> int:
    """The LSTM width whose model has the attention model's parameter count (closest integer)."""
    target = Seq2Seq(model_config(shape, "attention")).num_parameters()
    d = shape["d_model"]
    # Per layer the LSTM mixer has 4H(d + H) + 8H (two biases) + H*d + d (projection back);
    # attention has 4d^2 + 4d. Solve 4H^2 + (5d + 8)H + d = 4d^2 + 4d for H.
    a, b, c = 4.0, 5.0 * d + 8.0, d - 4.0 * d * d - 4.0 * d
    width = round((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a))
    best = min(range(max(1, width - 2), width + 3),
               key=lambda h: abs(Seq2Seq(model_config(shape, "lstm", h)).num_parameters() - target))
    return best


def ours(name: str, model: Seq2Seq, use_cache: bool = True, max_new_tokens: int | None = None,
         eos_check_interval: int | None = None) -> Contender:

    def generate(src: Tensor, new_tokens: int) -> Tensor:
        return model.generate(src, max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=use_cache,
                              eos_check_interval=eos_check_interval)

    def state_bytes(batch: int, source_length: int, new_tokens: int) -> int:
        src = torch.full((batch, source_length), 3, device=next(model.parameters()).device)
        return model.start(src, max_steps=new_tokens).nbytes

    def prefill(src: Tensor):
        return model.start(src, max_steps=1)

    return Contender(name, model.num_parameters(), prefill, generate, state_bytes, seq2seq_reads(model),
                     max_new_tokens, model)


def cuda_graphed(contender: Contender) -> Contender:
    """The same model, decoding through one captured CUDA-graph step (fixed batch, fixed length)."""
    from hybrid.generation.cuda_graph import generate_with_cuda_graph

    model = contender.model

    def generate(src: Tensor, new_tokens: int) -> Tensor:
        # Exactly `new_tokens` each, like every contender; no row ends early, so nothing need be checked.
        return generate_with_cuda_graph(model, src, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                        eos_check_interval=new_tokens)

    return dataclasses.replace(contender, name=contender.name + "+cuda-graph", generate=generate)


def hugging_face_bart(shape: dict, device, dtype, max_new_tokens: int | None) -> Contender | None:
    """transformers' BartForConditionalGeneration of the same shape, random weights, its own generate()."""
    try:
        from transformers import BartConfig, BartForConditionalGeneration
    except ImportError:
        return None
    config = BartConfig(
        vocab_size=shape["vocab_size"], d_model=shape["d_model"], encoder_layers=shape["encoder_layers"],
        decoder_layers=shape["decoder_layers"], encoder_attention_heads=shape["n_heads"],
        decoder_attention_heads=shape["n_heads"], encoder_ffn_dim=shape["d_ff"], decoder_ffn_dim=shape["d_ff"],
        max_position_embeddings=shape["max_positions"] + 2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, forced_bos_token_id=None, forced_eos_token_id=None, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)
    model = BartForConditionalGeneration(config).to(device=device, dtype=dtype).eval()
    reads = bart_reads(model, torch.finfo(dtype).bits // 8)

    def generate(src: Tensor, new_tokens: int) -> Tensor:
        output = model.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, do_sample=False, num_beams=1)
        return output[:, 1:]  # the new tokens, like every contender: not the decoder start token

    def prefill(src: Tensor):
        return model.get_encoder()(input_ids=src, attention_mask=torch.ones_like(src))

    def state_bytes(batch: int, source_length: int, new_tokens: int) -> int:
        return int(reads.state_bytes(batch, source_length, new_tokens))  # its cache once all are fed

    return Contender("bart-hf-generate", sum(p.numel() for p in model.parameters()), prefill, generate,
                     state_bytes, reads, max_new_tokens, model)


def build_contenders(shape: dict, settings: dict, device, dtype) -> list[Contender]:
    """The attention decoder (cached and not), the LSTM (equal width and parameter-matched),
    every other registered mixer, and transformers' BART when it is installed."""
    torch.manual_seed(settings["seed"])

    def build(mixers, lstm_hidden_size=None) -> Seq2Seq:
        return Seq2Seq(model_config(shape, mixers, lstm_hidden_size)).to(device=device, dtype=dtype).eval()

    attention = build("attention")
    contenders = [
        ours("attention+kv-cache", attention),
        dataclasses.replace(ours("attention-no-cache", attention, use_cache=False,
                                 max_new_tokens=settings["uncached_max_new_tokens"]),
                            max_batch=settings["uncached_max_batch"]),
        ours("lstm", build("lstm")),
        ours("lstm-param-matched", build("lstm", parameter_matched_lstm_width(shape))),
    ]
    contenders += [ours(name, build(name)) for name in sorted(MIXERS) if name not in ("attention", "lstm")]
    if settings["cuda_graph"] and torch.device(device).type == "cuda":
        graphed = [c for c in contenders if c.name in ("attention+kv-cache", "lstm", "lstm-param-matched")]
        contenders += [cuda_graphed(c) for c in graphed]
    if settings["huggingface_bart"]:
        bart = hugging_face_bart(shape, device, dtype, settings["bart_max_new_tokens"])
        if bart is not None:
            contenders.append(bart)
    return [c for c in contenders if c.name in settings["models"] or settings["models"] == "all"]
