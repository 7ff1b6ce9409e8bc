"""The decoders a benchmark run compares, each behind the same two calls: ``prefill`` and ``generate``.

Every contender shares width, depth, heads, FFN size, vocabulary, dtype and device, so
a row differs from another only in how the decoder mixes tokens (or whose code runs it).
A new row is one :class:`Contender` appended in :func:`build_contenders`; :func:`ours`
makes one for any :class:`Seq2Seq` and a way of driving it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hybrid.accel import Accelerator
from hybrid.bench.floor import StepReads, bart_reads, seq2seq_reads
from hybrid.config import ModelConfig
from hybrid.mixers import MIXERS
from hybrid.model import Seq2Seq

if TYPE_CHECKING:
    from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Contender:
    """One row family of the benchmark: a model and the way it is driven."""

    name: str
    parameters: int
    prefill: Callable[[Tensor], object]  # encoder + cross-attention keys/values (+ state allocation)
    generate: Callable[[Tensor, int], Tensor]  # (batch, N) new token ids, no start token, by the cell's strategy
    state_bytes: Callable[[int, int, int], int]  # (batch, source_length, new_tokens) -> bytes
    step_reads: StepReads  # the bytes a decode step reads: its floor
    max_new_tokens: int | None = None  # longer cells are skipped (the uncached loop is quadratic)
    model: torch.nn.Module | None = None
    max_batch: int | None = None  # wider cells are skipped
    prefill_steps: int = 0  # decode steps that ``prefill`` runs too (an engine with no encoder-only call)
    setup_seconds: float | None = None  # export or compilation, paid once per process (timed apart)
    mixer: str | None = None  # the registered mixer of every decoder layer, for our eager rows; else None
    generation: dict = dataclasses.field(default_factory=dict)  # our generate()'s strategy options (strategy_options)


def model_config(shape: dict, mixers: str | list[str], lstm_hidden_size: int | None = None) -> ModelConfig:
    return ModelConfig(vocab_size=shape["vocab_size"], d_model=shape["d_model"], n_heads=shape["n_heads"],
                       d_ff=shape["d_ff"], encoder_layers=shape["encoder_layers"],
                       decoder_layers=shape["decoder_layers"], decoder_mixers=mixers, dropout=0.0,
                       max_positions=shape["max_positions"],
                       mixer_options={"lstm": {"hidden_size": lstm_hidden_size}} if lstm_hidden_size else {})


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


STRATEGY_OPTIONS = ("num_beams", "do_sample", "top_k", "top_p", "temperature")


def strategy_options(generation: dict) -> dict:
    """The decoding strategy of every cell, from the bench's ``generation`` settings (transformers' names:
    ``num_beams``; ``do_sample`` with ``top_k``, ``top_p``, ``temperature``), as ``generate()`` takes it:
    the sampling options only when sampling. Any other option is refused, naming what is allowed, since
    each must also be mapped to CTranslate2 (:func:`ctranslate2_options`)."""
    unknown = sorted(set(generation) - set(STRATEGY_OPTIONS))
    if unknown:
        raise ValueError(f"generation takes {', '.join(STRATEGY_OPTIONS)} (each mapped to CTranslate2 too), "
                         f"got {unknown}")
    options = {"num_beams": generation.get("num_beams", 1)}
    if generation.get("do_sample"):
        options.update(do_sample=True, top_k=generation.get("top_k", 50), top_p=generation.get("top_p", 1.0),
                       temperature=generation.get("temperature", 1.0))
    return options


def strategy_name(options: dict) -> str:
    """:func:`strategy_options` in words, for tables: "greedy", "beam 4", "sampling (top-k 10)"."""
    if options.get("do_sample"):
        settings = [f"top-k {options['top_k']}" if options.get("top_k") else "",
                    f"top-p {options['top_p']}" if options.get("top_p", 1.0) < 1.0 else "",
                    f"temperature {options['temperature']}" if options.get("temperature", 1.0) != 1.0 else ""]
        return "sampling" + (f" ({', '.join(filter(None, settings))})" if any(settings) else "")
    beams = options.get("num_beams", 1)
    return f"beam {beams}" if beams > 1 else "greedy"


def ctranslate2_options(generation: dict) -> dict:
    """:func:`strategy_options` in ``translate_batch``'s words: beams, or sampling from the top k (CTranslate2's
    top k of 1 is greedy; 0, like transformers' ``top_k=0``, the whole vocabulary), top p and temperature."""
    options = strategy_options(generation)
    if not options.get("do_sample"):
        return {"beam_size": options["num_beams"]}
    return {"beam_size": 1, "sampling_topk": options["top_k"] or 0, "sampling_topp": options["top_p"],
            "sampling_temperature": options["temperature"]}


def ours(name: str, model: Seq2Seq, use_cache: bool = True, max_new_tokens: int | None = None,
         eos_check_interval: int | None = None, mixer: str | None = None, generation: dict | None = None) -> Contender:
    options = strategy_options(generation or {})

    def generate(src: Tensor, new_tokens: int) -> Tensor:
        return model.generate(src, max_new_tokens=new_tokens, min_new_tokens=new_tokens, use_cache=use_cache,
                              eos_check_interval=eos_check_interval, **options)

    def state_bytes(batch: int, source_length: int, new_tokens: int) -> int:
        src = torch.full((batch, source_length), 3, device=next(model.parameters()).device)
        state = model.start(src, max_steps=new_tokens)
        state.reserve(new_tokens)  # as large as it grows by the last token
        return state.nbytes

    def prefill(src: Tensor):
        return model.start(src, max_steps=1)

    return Contender(name, model.num_parameters(), prefill, generate, state_bytes, seq2seq_reads(model),
                     max_new_tokens, model, mixer=mixer, generation=generation or {})


def fast(contender: Contender, quantize: str | None = None) -> Contender:
    """The same weights on the fast path (``Seq2Seq.optimize_for_inference``): ONNX Runtime on a CPU,
    int8 weights with ``quantize="int8"``, CUDA graphs inside ``generate`` on a GPU. The export happens
    here, in a short warm-up decode, and its time is the row's ``setup_seconds``."""
    model = copy.deepcopy(contender.model).optimize_for_inference(quantize)
    src = torch.full((1, 4), 3, device=next(model.parameters()).device)
    # Exports (or captures) the cells' path: one advance per token for greedy decoding and sampling.
    model.generate(src, max_new_tokens=2, min_new_tokens=2, **strategy_options(contender.generation))
    setup = model.accelerator.setup_seconds
    row = ours(f"{contender.name}+{quantize or 'fast'}", model, max_new_tokens=contender.max_new_tokens,
               generation=contender.generation)
    return dataclasses.replace(row, step_reads=seq2seq_reads(model, int8=quantize == "int8"), setup_seconds=setup)


class _InductorStep(Accelerator):
    """A route the fast path measured and did not take: ``torch.compile`` (inductor) of the eager step,
    shapes static, installed as the model's accelerator."""

    def __init__(self, model: Seq2Seq) -> None:
        super().__init__(model)
        self.compiled_step = torch.compile(model.eager_step, dynamic=False)

    def step(self, tokens: Tensor, state, position) -> Tensor:
        positions = position if isinstance(position, Tensor) else torch.tensor(position, device=tokens.device)
        return self.compiled_step(tokens, state, positions.expand(tokens.shape[0]))


def inductor(contender: Contender) -> Contender:
    """The same weights, stepped by ``torch.compile`` of the eager step; compiled in a warm-up decode of
    the benchmark's shortest batch-1 cell, timed as ``setup_seconds`` (each new shape compiles again)."""
    model = copy.deepcopy(contender.model)
    model.accelerator = _InductorStep(model)
    begin = time.perf_counter()
    model.generate(torch.full((1, 4), 3, device=next(model.parameters()).device), max_new_tokens=2,
                   min_new_tokens=2, **strategy_options(contender.generation))
    row = ours(f"{contender.name}+inductor", model, max_new_tokens=contender.max_new_tokens,
               generation=contender.generation)
    return dataclasses.replace(row, setup_seconds=time.perf_counter() - begin)


def bart_model(shape: dict) -> BartForConditionalGeneration | None:
    """transformers' ``BartForConditionalGeneration`` of the benchmark's shape with random weights
    (float32, on the CPU, in eval mode), or None with a logged note when transformers is not installed."""
    try:
        from transformers import BartConfig, BartForConditionalGeneration
    except ImportError:
        logger.warning("transformers is not installed (the bench extra): no BART rows")
        return None
    config = BartConfig(
        vocab_size=shape["vocab_size"], d_model=shape["d_model"], encoder_layers=shape["encoder_layers"],
        decoder_layers=shape["decoder_layers"], encoder_attention_heads=shape["n_heads"],
        decoder_attention_heads=shape["n_heads"], encoder_ffn_dim=shape["d_ff"], decoder_ffn_dim=shape["d_ff"],
        max_position_embeddings=shape["max_positions"] + 2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, forced_bos_token_id=None, forced_eos_token_id=None, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)
    # BART is post-norm; CTranslate2's converter reads this flag, which transformers 5 no longer sets.
    config.normalize_before = False
    return BartForConditionalGeneration(config).eval()


def hugging_face_bart(model: BartForConditionalGeneration, device, dtype, max_new_tokens: int | None,
                      generation: dict | None = None) -> Contender:
    """``model`` (a :func:`bart_model`), moved to ``device`` and ``dtype``, decoding through its own generate()."""
    model = model.to(device=device, dtype=dtype)
    reads = bart_reads(model, torch.finfo(dtype).bits // 8)
    options = {"do_sample": False, **strategy_options(generation or {})}

    def generate(src: Tensor, new_tokens: int) -> Tensor:
        output = model.generate(src, attention_mask=torch.ones_like(src), max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens, **options)
        return output[:, 1:]  # the new tokens, like every contender: not the decoder start token

    def prefill(src: Tensor):
        return model.get_encoder()(input_ids=src, attention_mask=torch.ones_like(src))

    return Contender("bart-hf-generate", sum(p.numel() for p in model.parameters()), prefill, generate,
                     _cache_bytes(reads), reads, max_new_tokens, model)


def ctranslate2_bart(model: BartForConditionalGeneration, compute_types: list[str], threads: int,
                     device, generation: dict | None = None) -> list[Contender]:
    """CTranslate2 running ``model`` (a :func:`bart_model`) converted by its own converter, one row per
    compute type that CTranslate2 supports on ``device``; none, with a logged note, when it is not installed.

    The cells' strategy (:func:`ctranslate2_options`: greedy, beams or sampling), exactly N tokens
    (``min_decoding_length = max_decoding_length = N``), ``threads`` intra-op
    threads and one translator. CTranslate2 takes tokens as strings: the converter names its vocabulary
    after the tokenizer's (:func:`_id_tokenizer` names each token by its id), and the ids every contender
    gets are mapped through the converted model's own vocabulary file. Its config adds no BOS or EOS to
    the source and starts the decoder from BOS (``decoder_start_token_id``), as transformers' BART and
    ours do. It has no encoder-only call, so its prefill is a one-token translation
    (``prefill_steps=1``): the runner divides the rest of a call by the N - 1 tokens left.
    """
    try:
        import ctranslate2
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        logger.warning("ctranslate2 is not installed (the bench extra): no CTranslate2 rows")
        return []
    device = torch.device(device)
    index = device.index or 0
    supported = ctranslate2.get_supported_compute_types(device.type, index)
    for compute_type in sorted(set(compute_types) - supported):
        logger.warning("CTranslate2 does not support compute type %s on %s: no row for it", compute_type, device)
    with tempfile.TemporaryDirectory() as folder:
        original, converted = Path(folder, "transformers"), Path(folder, "ctranslate2")
        with _no_progress_bars():
            model.save_pretrained(original)
            _id_tokenizer(model.config).save_pretrained(original)
            TransformersConverter(str(original)).convert(str(converted))
        vocabulary = json.loads((converted / "shared_vocabulary.json").read_text())
        translators = {compute_type: ctranslate2.Translator(str(converted), device=device.type, device_index=index,
                                                            compute_type=compute_type, inter_threads=1,
                                                            intra_threads=threads)
                       for compute_type in compute_types if compute_type in supported}
    ids = {token: position for position, token in enumerate(vocabulary)}
    parameters = sum(p.numel() for p in model.parameters())
    options = ctranslate2_options(generation or {})

    def contender(compute_type: str, translator) -> Contender:
        # Float tensors (biases, norms, activations, caches) take float16 or bfloat16 where the
        # compute type names one, float32 otherwise; "int8..." stores the weights in int8.
        reads = bart_reads(model, 2 if compute_type.endswith("16") else 4, int8=compute_type.startswith("int8"))

        def translate(src: Tensor, new_tokens: int):
            source = [[vocabulary[i] for i in row] for row in src.tolist()]
            # max_input_length=0: never truncate the source; beam_size defaults to 2, so it is always given.
            return translator.translate_batch(source, min_decoding_length=new_tokens, max_decoding_length=new_tokens,
                                              max_input_length=0, **options)

        def generate(src: Tensor, new_tokens: int) -> Tensor:
            return torch.tensor([[ids[token] for token in result.hypotheses[0]]
                                 for result in translate(src, new_tokens)])

        return Contender(f"bart-ct2-{compute_type}", parameters, lambda src: translate(src, 1), generate,
                         _cache_bytes(reads), reads, prefill_steps=1)

    return [contender(compute_type, translator) for compute_type, translator in translators.items()]


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """transformers draws a progress bar for every save and load (the converter loads the model again);
    a benchmark's output is its rows."""
    from transformers.utils import logging as transformers_logging

    enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            transformers_logging.enable_progress_bar()


def _cache_bytes(reads: StepReads) -> Callable[[int, int, int], int]:
    """A ``state_bytes`` for an engine whose state we cannot inspect: the cache its step reads, once all N are fed."""
    return lambda batch, source_length, new_tokens: int(reads.state_bytes(batch, source_length, new_tokens))


def _id_tokenizer(config: BartConfig) -> PreTrainedTokenizerFast:
    """A word-level tokenizer whose token of id i is the string ``str(i)``, with BART's special ids:
    the converter takes its vocabulary (in id order) and special tokens from a tokenizer."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    unknown = 3  # BART's own unknown id; the config names none
    vocabulary = {str(i): i for i in range(config.vocab_size)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocabulary, unk_token=str(unknown))),
        bos_token=str(config.bos_token_id), eos_token=str(config.eos_token_id),
        pad_token=str(config.pad_token_id), unk_token=str(unknown))


def mixer_row(name: str) -> str:
    """The benchmark row of the decoder whose every layer is mixer ``name``: its name, with
    "+kv-cache" where its state grows with the length (attention's)."""
    return name if MIXERS[name].constant_state else f"{name}+kv-cache"


def build_contenders(shape: dict, settings: dict, device, dtype) -> list[Contender]:
    """A decoder for every registered mixer (attention with its KV cache), attention without a
    cache, the parameter-matched LSTM, and one random BART run by transformers' generate() and by
    CTranslate2 at each of its compute types, when they are installed (the bench extra)."""
    torch.manual_seed(settings["seed"])

    def build(mixers, lstm_hidden_size=None) -> Seq2Seq:
        return Seq2Seq(model_config(shape, mixers, lstm_hidden_size)).to(device=device, dtype=dtype).eval()

    generation = dict(settings.get("generation") or {})
    strategy_options(generation)  # refused here, before any model is built, when it names an unknown option
    contenders = [ours(mixer_row(name), build(name), mixer=name, generation=generation) for name in MIXERS]
    attention = contenders[list(MIXERS).index("attention")].model
    contenders += [
        dataclasses.replace(ours("attention-no-cache", attention, use_cache=False,
                                 max_new_tokens=settings["uncached_max_new_tokens"], generation=generation),
                            max_batch=settings["uncached_max_batch"]),
        ours("lstm-param-matched", build("lstm", parameter_matched_lstm_width(shape)), mixer="lstm",
             generation=generation),
    ]
    on_gpu = torch.device(device).type == "cuda"
    for base in [c for c in contenders if c.name in settings["fast"]]:
        # On a GPU the fast path is CUDA graphs, and int8 is the CPU path's (ONNX Runtime's) alone.
        contenders += [fast(base, quantize) for quantize in settings["fast_quantize"]
                       if not (on_gpu and quantize)]
        if settings["inductor"] and not on_gpu:
            contenders.append(inductor(base))
    bart = bart_model(shape) if settings["huggingface_bart"] or settings["ctranslate2"] else None
    if bart is not None:
        # Converted first: the transformers row then moves the same model to the benchmark's device and dtype.
        compute_types = settings["ctranslate2_compute_types"][torch.device(device).type]
        ctranslate2_rows = (ctranslate2_bart(bart, compute_types, settings["threads"], device, generation)
                            if settings["ctranslate2"] else [])
        if settings["huggingface_bart"]:
            contenders.append(hugging_face_bart(bart, device, dtype, settings["bart_max_new_tokens"], generation))
        contenders += ctranslate2_rows
    caps = settings["row_max_new_tokens"] or {}
    contenders = [dataclasses.replace(c, max_new_tokens=min(caps[c.name], c.max_new_tokens or caps[c.name]))
                  if c.name in caps else c for c in contenders]
    return [c for c in contenders if c.name in settings["models"] or settings["models"] == "all"]
