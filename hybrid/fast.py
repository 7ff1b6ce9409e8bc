"""The fast inference path: one decoder step, for any mix of mixers, run with the least work per token.

At batch 1 a step of this model is a few dozen small matrix-vector products, and PyTorch's eager
dispatch (a few microseconds per op, ~100 ops) costs as much as the arithmetic. The measured routes
(``results/fast-routes/``) put ONNX Runtime ahead on a CPU, so :meth:`hybrid.Seq2Seq.optimize_for_inference`
exports the step, exactly as ``Seq2Seq.step_unchecked`` computes it, to ONNX with ``torch.onnx.export``
and runs it with ONNX Runtime (optionally with int8 weights, by ONNX Runtime's dynamic quantization).
On a GPU the step is instead captured in a CUDA graph and replayed (:mod:`hybrid.generation.cuda_graph`).

Nothing here is specific to a mixer: the export sees every state tensor of every layer
(:meth:`hybrid.mixers.MixerState.tensors`), binds it as an input and its updated value as an output
at the same address, so the state is updated in place as in the eager step, and every path that
steps the model (``generate``, continuous refill, ``hybrid generate``) runs the fast step unchanged.
A graph is exported once per rows-per-source (beams share a source), with the batch, source length
and capacity left dynamic, so it serves every later shape; the time it took is kept in
:attr:`OnnxStep.export_seconds`. Given a cache folder (``optimize_for_inference(cache_dir=...)``, by
default ``<folder>/fast`` for a model from ``from_pretrained``), each exported graph is also written
there under a name made from everything that shapes it (:func:`graph_key`), so a later process loads
it in a fraction of a second instead of exporting again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from hybrid.files import write_atomically

logger = logging.getLogger(__name__)

QUANTIZATIONS = (None, "int8")
# Opset 23 has ONNX's Attention operator, so each scaled_dot_product_attention is one node for ONNX
# Runtime, not a dozen (the key transpose, the mask, a NaN guard): at batch 1 a step costs ~0.8 µs
# per node, and this cut the LSTM step at the default shape by ~20%.
OPSET = 23
_NUMPY_TYPES = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool"}


class _StepGraph(nn.Module):
    """``model.step_unchecked`` as a function of tensors alone, the form an exporter can trace.

    Inputs: the fed tokens (B,), each row's position (B,), the memory mask, then every layer's
    cross-attention keys, values and mixer state tensors. Outputs: the logits and the updated state.
    """

    def __init__(self, model, template) -> None:
        super().__init__()
        self.model, self.template = model, template

    def forward(self, tokens: Tensor, positions: Tensor, memory_mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        state = self.template
        layers = len(state.mixer_states)
        state.memory_mask = memory_mask
        state.cross_keys, state.cross_values = list(tensors[:layers]), list(tensors[layers:2 * layers])
        _assign_mixer_tensors(state, tensors[2 * layers:])
        logits = self.model._eager_step(tokens, state, positions)
        return (logits, *_mixer_tensors(state))


class _AdvanceGraph(nn.Module):
    """:func:`hybrid.generation.stepping.advance` with greedy rules that read only lengths, as one graph.

    Inputs: the rows' tokens, positions, finished flags and outputs, the ``min_new_tokens`` and
    ``max_new_tokens`` limits (0-d), then the state as in :class:`_StepGraph`. Outputs: the updated
    tokens, the next positions, finished flags and outputs, and the updated mixer state.
    """

    def __init__(self, model, rules, template) -> None:
        super().__init__()
        self.model, self.rules, self.template = model, rules, template

    def forward(self, tokens: Tensor, positions: Tensor, finished: Tensor, outputs: Tensor, min_new_tokens: Tensor,
                max_new_tokens: Tensor, memory_mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        from hybrid.generation.stepping import Rows, advance

        state = self.template
        layers = len(state.mixer_states)
        state.memory_mask = memory_mask
        state.cross_keys, state.cross_values = list(tensors[:layers]), list(tensors[layers:2 * layers])
        _assign_mixer_tensors(state, tensors[2 * layers:])
        rows = Rows(tokens, positions, finished, outputs)
        advance(self.model._eager_step, self.rules.with_length_limits(min_new_tokens, max_new_tokens), state, rows)
        return (rows.tokens, rows.positions, rows.finished, rows.outputs, *_mixer_tensors(state))


def _mixer_tensors(state) -> list[Tensor]:
    return [tensor for mixer_state in state.mixer_states for tensor in mixer_state.tensors()]


def _assign_mixer_tensors(state, tensors) -> None:
    index = 0
    for mixer_state in state.mixer_states:
        for field in dataclasses.fields(mixer_state):
            setattr(mixer_state, field.name, tensors[index])
            index += 1


def _state_inputs(state) -> list[Tensor]:
    """Every tensor of a DecodeState in the graph's input order (after tokens and positions)."""
    return [state.memory_mask, *state.cross_keys, *state.cross_values, *_mixer_tensors(state)]


class OnnxStep:
    """The decoder step of one model run by ONNX Runtime: one session per rows-per-source, state bound in place.

    ``quantize="int8"`` quantizes the weights of every matrix product to int8 (ONNX Runtime's
    ``quantize_dynamic``: int8 weights, activations quantized per call). The exported graph holds
    a copy of the weights: :meth:`check_weights` (called by ``Seq2Seq.start``) refuses to run
    after they have changed. With a ``cache_dir``, each graph is read from it when a process has
    exported it before (its key in :attr:`loaded_from_cache`), else exported and written there.
    """

    def __init__(self, model, quantize: str | None = None, cache_dir: str | os.PathLike | None = None) -> None:
        if quantize not in QUANTIZATIONS:
            raise ValueError(f"quantize must be one of {QUANTIZATIONS}, got {quantize!r}")
        try:
            import onnxruntime  # noqa: F401  (fail now, not at the first step)
        except ImportError as error:
            raise ImportError("the fast path on a CPU runs on ONNX Runtime, which installs with hybrid: "
                              "pip install onnxruntime onnx onnxscript") from error

        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:
            raise ValueError(f"the ONNX Runtime path runs float32 models on a CPU; this one is {dtype}")
        if any(parameter.is_inference() for parameter in model.parameters()):
            # Their version counters, which the stale-weights check reads, do not exist.
            raise ValueError("the model's parameters are inference tensors (made or copied inside "
                             "torch.inference_mode()); build, load or copy the model outside it, then call "
                             "optimize_for_inference()")
        self.model, self.quantize = model, quantize
        self.threads = torch.get_num_threads()
        self.sessions: dict[int, object] = {}
        self.export_seconds: dict[int, float] = {}  # per graph: its export, or its load from the cache
        self.loaded_from_cache: set = set()
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self._weights_digest = None if cache_dir is None else weights_digest(model)
        self._versions = _weight_versions(model)
        self._bindings: dict[tuple, _Binding] = {}

    def check_weights(self) -> None:
        """Raise if the model's weights changed since the export (the graph would decode the old ones)."""
        if _weight_versions(self.model) != self._versions:
            raise ValueError("the model's weights changed after optimize_for_inference(); call it again so that "
                             "the fast step decodes the new weights")

    def __call__(self, tokens: Tensor, state, position: int | Tensor) -> Tensor:
        binding = self._binding(state)
        binding.tokens.copy_(tokens)
        if isinstance(position, Tensor):
            binding.positions.copy_(position.expand(binding.positions.shape[0]))
        else:
            binding.positions.fill_(position)
        binding.session.run_with_iobinding(binding.io)
        return binding.logits.clone()  # the bound buffer is overwritten by the next step

    def can_advance(self, rules) -> bool:
        """Whether :meth:`advance` can run these rules inside its graph (greedy, lengths only, no criteria)."""
        return rules.reads_only_lengths

    def advance(self, rules, state, rows) -> None:
        """:func:`hybrid.generation.stepping.advance` of every row in one call into ONNX Runtime."""
        key = ("advance", *rules.graph_signature, state.group_size,
               *((t.data_ptr(), *t.shape) for t in [rows.tokens, rows.positions, rows.finished, rows.outputs,
                                                     *_state_inputs(state)]))
        binding = self._bindings.get(key)
        if binding is None:
            if len(self._bindings) > 64:
                self._bindings.clear()
            session = self._session(("advance", *rules.graph_signature, state.group_size), rules)
            binding = self._bindings[key] = _AdvanceBinding(session, state, rows)
        binding.limits[0].fill_(_min_new_tokens(rules))
        binding.limits[1].fill_(rules.max_new_tokens)
        binding.session.run_with_iobinding(binding.io)
        rows.positions.copy_(binding.next_positions)  # written apart: nothing else in the graph waits on them

    def _binding(self, state) -> _Binding:
        """The session's IO binding for this state's tensors, made once per set of tensors (a reorder or
        refill that replaces them makes a new one; stepping in place reuses it)."""
        inputs = _state_inputs(state)
        key = (state.group_size, *((t.data_ptr(), *t.shape) for t in inputs))
        binding = self._bindings.get(key)
        if binding is None:
            if len(self._bindings) > 64:  # states come and go; keep the cache from growing with them
                self._bindings.clear()
            session = self._session(state.group_size)
            binding = self._bindings[key] = _Binding(session, state, inputs, self.model.config.vocab_size)
        return binding

    def _session(self, key, rules=None):
        """The session of ``key``: a rows-per-source (the step) or ``("advance", ...)`` (the greedy step)."""
        if key not in self.sessions:
            begin = time.perf_counter()
            path = None if self.cache_dir is None else self.cache_dir / graph_key(self._weights_digest, key,
                                                                                   self.quantize)
            cached = None if path is None else _read_cached(path)
            if cached is not None:
                path, graph = cached
                self.loaded_from_cache.add(key)
                logger.info("loaded the fast step from %s", path)
            else:
                graph = self._export(key, rules)
                path = None if path is None else _write_cached(path, graph)
                logger.info("exported the fast step in %.1f s%s", time.perf_counter() - begin,
                            "" if path is None else f", cached as {path} for the next process")
            self.sessions[key] = self._open(graph)
            self.export_seconds[key] = time.perf_counter() - begin
        return self.sessions[key]

    def _open(self, graph: bytes):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])

    def _export(self, key, rules) -> bytes:
        """The ONNX graph of ``key``'s step, serialised, with the weights inline."""
        model = self.model
        group_size = key if rules is None else key[-1]
        sources = 2
        src = torch.full((sources, 3), model.config.eos_id, dtype=torch.long, device="cpu")
        template = model.start(src, max_steps=4)
        if group_size > 1:
            template.expand(group_size)
        rows = sources * group_size
        state_inputs = [t.contiguous() for t in _state_inputs(template)]
        state_shapes = _dynamic_shapes(template, group_size)
        if rules is None:
            graph = _StepGraph(model, template)
            example = (torch.full((rows,), model.config.bos_id), torch.zeros(rows, dtype=torch.long), *state_inputs)
            shapes = state_shapes
        else:
            from hybrid.generation.stepping import Rows

            graph = _AdvanceGraph(model, rules, template)
            example_rows = Rows.start(rows, 4, model.config.bos_id, rules.pad_id, "cpu")
            limit = torch.tensor(4)
            example = (example_rows.tokens, example_rows.positions, example_rows.finished, example_rows.outputs,
                       limit, limit + 0, *state_inputs)
            row_dims = state_shapes[0]
            outputs_length = torch.export.Dim("outputs_length", min=2, max=1 << 20)
            shapes = (row_dims, row_dims, row_dims, {**row_dims, 1: outputs_length}, {}, {}, *state_shapes[2:])
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "step.onnx"
            with _quiet_exporter(), torch.no_grad():
                # The weights inline (external_data=False): one file to cache and to read back, within
                # ONNX's 2 GB limit on a graph, far above this model's sizes.
                torch.onnx.export(graph, example, str(path), dynamo=True, dynamic_shapes=shapes, optimize=True,
                                  opset_version=OPSET, external_data=False)
            if self.quantize == "int8":
                from onnxruntime.quantization import QuantType, quantize_dynamic
                from onnxruntime.quantization.registry import IntegerOpsRegistry

                quantized = Path(folder) / "step-int8.onnx"
                # Attention's int8 form (QAttention) is the older contrib operator, which the opset-23
                # Attention node does not map to; its inputs are activations anyway, not weights.
                with _quiet_exporter():
                    quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8,
                                     op_types_to_quantize=[op for op in IntegerOpsRegistry if op != "Attention"])
                path = quantized
            return path.read_bytes()


def cache_dir_for(checkpoint: str | os.PathLike) -> Path:
    """Where the fast path caches a saved model's graphs: ``<folder>/fast`` for a folder written by
    ``save_pretrained`` (or ``hybrid export``), ``<file>.fast`` beside a training checkpoint."""
    checkpoint = Path(checkpoint)
    return checkpoint / "fast" if checkpoint.is_dir() else checkpoint.with_name(checkpoint.name + ".fast")


def weights_digest(model) -> str:
    """SHA-256 of a model's config and of every tensor in its state dict (name, dtype, shape, bytes):
    what an exported graph copies from the model, so a graph cached under it is this model's."""
    digest = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True).encode())
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def graph_key(weights: str, key, quantize: str | None) -> str:
    """The name one graph is cached under (:func:`_write_cached` adds the digest of its bytes): a digest of
    everything that shapes the graph (the weights, its kind and decoding rules, the quantization, the opset,
    the versions of hybrid's code and of the packages that trace and quantize it), then its kind in words:
    ``<digest>-step-rows3-fp32.onnx`` is the float32 step of three rows per source (beams)."""
    if isinstance(key, tuple):  # ("advance", *DecodingRules.graph_signature, rows per source): plain greedy
        kind = f"greedy-rows{key[-1]}"
    else:  # rows per source: beams or samples of one source
        kind = f"step-rows{key}"
    settings = json.dumps([weights, repr(key), quantize, OPSET, _toolchain()])
    return f"{hashlib.sha256(settings.encode()).hexdigest()[:16]}-{kind}-{quantize or 'fp32'}.onnx"


@functools.cache
def _toolchain() -> dict[str, str]:
    """The versions of what traces, converts and quantizes the step, and a digest of hybrid's own code,
    which defines the step: any change to them may change the graph."""
    versions = {name: importlib.metadata.version(name) for name in ("torch", "onnx", "onnxscript", "onnxruntime")}
    code = hashlib.sha256()
    package = Path(__file__).parent
    for path in sorted(package.rglob("*.py")):
        code.update(str(path.relative_to(package)).encode())
        code.update(path.read_bytes())
    return {**versions, "hybrid": code.hexdigest()}


def _read_cached(path: Path) -> tuple[Path, bytes] | None:
    """The file and bytes of a cached graph, if one is whole: its name ends with the SHA-256 of its bytes
    (:func:`_write_cached`), so a damaged or cut file is recognised, removed where it can be, never used."""
    for candidate in sorted(path.parent.glob(f"{path.stem}.*{path.suffix}")):
        try:
            graph = candidate.read_bytes()
        except OSError:
            continue
        if candidate.name == _content_name(path, graph):
            return candidate, graph
        logger.warning("%s is damaged (its bytes do not match the digest in its name); exporting again", candidate)
        with contextlib.suppress(OSError):
            candidate.unlink()
    return None


def _write_cached(path: Path, graph: bytes) -> Path | None:
    """Write ``graph`` atomically beside ``path``, its name carrying the SHA-256 of its bytes, and return
    where. A folder that cannot be written is no error: the graph stays in memory (None)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomically(path.with_name(_content_name(path, graph)), graph)
    except OSError as error:
        logger.warning("cannot cache the fast step in %s (%s): it was exported in memory, and every process "
                       "will export it again", path.parent, error)
        return None


def _content_name(path: Path, graph: bytes) -> str:
    return f"{path.stem}.{hashlib.sha256(graph).hexdigest()[:16]}{path.suffix}"


class _AdvanceBinding:
    """The greedy step's binding of one set of rows and one state: all in place but the next positions."""

    def __init__(self, session, state, rows) -> None:
        self.session = session
        self.limits = (torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long))
        self.next_positions = torch.empty_like(rows.positions)
        self.io = session.io_binding()
        names = [node.name for node in session.get_inputs()]
        inputs = [rows.tokens, rows.positions, rows.finished, rows.outputs, *self.limits, *_state_inputs(state)]
        for name, tensor in zip(names, inputs, strict=True):
            _bind(self.io.bind_input, name, tensor)
        # The positions' update depends on no other result of the step, so ONNX Runtime may compute it
        # first: written over its input, it would move every later read. It gets a buffer of its own.
        outputs = [rows.tokens, self.next_positions, rows.finished, rows.outputs, *_mixer_tensors(state)]
        for name, tensor in zip([node.name for node in session.get_outputs()], outputs, strict=True):
            _bind(self.io.bind_output, name, tensor)


def _min_new_tokens(rules) -> int:
    return next((rule.min_new_tokens for rule in rules.chain if hasattr(rule, "min_new_tokens")), 0)


@dataclasses.dataclass
class _Binding:
    """Tokens, positions and logits buffers of one batch, and the session's binding of them and of a state."""

    session: object
    state: object
    inputs: list[Tensor]
    vocab_size: int

    def __post_init__(self) -> None:
        rows = self.state.batch_size
        self.tokens = torch.zeros(rows, dtype=torch.long)
        self.positions = torch.zeros(rows, dtype=torch.long)
        self.logits = torch.empty(rows, self.vocab_size)
        self.io = self.session.io_binding()
        names = [node.name for node in self.session.get_inputs()]
        for name, tensor in zip(names, [self.tokens, self.positions, *self.inputs], strict=True):
            _bind(self.io.bind_input, name, tensor)
        outputs = [node.name for node in self.session.get_outputs()]
        _bind(self.io.bind_output, outputs[0], self.logits)
        # Each updated state tensor is written where it was read: in place, as the eager step does.
        for name, tensor in zip(outputs[1:], _mixer_tensors(self.state), strict=True):
            _bind(self.io.bind_output, name, tensor)


def _bind(bind, name: str, tensor: Tensor) -> None:
    import numpy

    if not tensor.is_contiguous():
        raise ValueError(f"{name}: the fast step binds tensors by address, so they must be contiguous")
    bind(name, "cpu", 0, numpy.dtype(_NUMPY_TYPES[tensor.dtype]), list(tensor.shape), tensor.data_ptr())


def _dynamic_shapes(template, group_size: int) -> tuple:
    """Batch, source length and capacity left free, so one export serves every shape of a decode."""
    sources = torch.export.Dim("sources", min=1, max=1 << 20)
    rows = sources * group_size if group_size > 1 else sources  # the rows of a source are consecutive
    length = torch.export.Dim("source_length", min=1, max=1 << 20)
    capacity = torch.export.Dim("capacity", min=1, max=1 << 20)
    layers = len(template.mixer_states)
    memory = [{0: sources, 2: length}] * (2 * layers)
    # Each state declares which dimension max_steps sizes (a cache's positions); the others are fixed.
    mixers = [{0: rows, **({state.steps_dim: capacity} if state.steps_dim is not None else {})}
              for state in template.mixer_states for _ in state.tensors()]
    return ({0: rows}, {0: rows}, {0: sources, 3: length}, (*memory, *mixers))


def _weight_versions(model) -> tuple[int, ...]:
    return tuple(parameter._version for parameter in model.parameters())


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter and the quantizer report every pass on the console; keep them to the log."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch._dynamo", "torch.export", "onnxscript",
                                                    "root")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
