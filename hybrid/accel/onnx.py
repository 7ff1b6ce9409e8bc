"""The fast path on a CPU: the decoder step exported to ONNX and run by ONNX Runtime, for any mix of mixers.

At batch 1 a step of this model is a few dozen small matrix-vector products, and PyTorch's eager
dispatch (a few microseconds per op, ~100 ops) costs as much as the arithmetic. The measured routes
(``results/fast-routes/``) put ONNX Runtime ahead on a CPU, so :meth:`hybrid.Seq2Seq.optimize_for_inference`
installs :class:`OnnxAccelerator`, which exports the step, exactly as ``Seq2Seq.eager_step`` computes it,
to ONNX with ``torch.onnx.export`` and runs it with ONNX Runtime (optionally with int8 weights, by ONNX
Runtime's dynamic quantization). On a GPU the same interface replays CUDA graphs instead
(:mod:`hybrid.accel.cuda_graph`).

Nothing here is specific to a mixer: the export sees every state tensor of every layer
(:meth:`hybrid.mixers.MixerState.tensors`), binds it as an input and its updated value as an output
at the same address, so the state is updated in place as in the eager step, and every path that
steps the model (``generate``, continuous refill, ``hybrid generate``) runs the fast step unchanged.
A graph is exported once per rows-per-source (beams share a source), with the batch, source length
and capacity left dynamic, so it serves every later shape; the time it took is kept in
:attr:`OnnxAccelerator.export_seconds`. Given a cache folder (``optimize_for_inference(cache_dir=...)``,
by default ``<folder>/fast`` for a model from ``from_pretrained``), each exported graph is also written
there under a name made from everything that shapes it (:func:`graph_key`), so a later process loads
it in a fraction of a second instead of exporting again.
"""

from __future__ import annotations

import contextlib
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

from hybrid.accel import (
    Accelerator,
    assign_state_tensors,
    mixer_tensors,
    shape_key,
    state_tensors,
)
from hybrid.files import write_atomically
from hybrid.generation.beams import Beams, advance_beams
from hybrid.generation.stepping import Rows, advance
from hybrid.state import DecodeState
from hybrid.validators import check_choice, check_int

logger = logging.getLogger(__name__)

QUANTIZATIONS = (None, "int8")
# Opset 23 has ONNX's Attention operator, so each scaled_dot_product_attention is one node for ONNX
# Runtime, not a dozen (the key transpose, the mask, a NaN guard): at batch 1 a step costs ~0.8 µs
# per node, and this cut the LSTM step at the default shape by ~20%.
OPSET = 23
_NUMPY_TYPES = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool"}


class _StepGraph(nn.Module):
    """``model.eager_step`` as a function of tensors alone, the form an exporter can trace.

    Inputs: the fed tokens (B,), each row's position (B,), then the state's tensors in
    :func:`~hybrid.accel.state_tensors`' order. Outputs: the logits and the updated mixer state.
    """

    def __init__(self, model, template: DecodeState) -> None:
        super().__init__()
        self.model, self.template = model, template

    def forward(self, tokens: Tensor, positions: Tensor, memory_mask: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        assign_state_tensors(self.template, [memory_mask, *tensors])
        logits = self.model.eager_step(tokens, self.template, positions)
        return (logits, *mixer_tensors(self.template))


class _MemoryGraph(nn.Module):
    """``model.eager_memory`` as a function of tensors: the source ids (B, S) and key mask (B, 1, 1, S) in,
    every decoder layer's cross-attention keys, then values, out."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor, key_mask: Tensor) -> tuple[Tensor, ...]:
        keys, values = self.model.eager_memory(src_ids, key_mask)
        return (*keys, *values)


class _AdvanceGraph(nn.Module):
    """:func:`hybrid.generation.stepping.advance` with rules that run in a graph
    (``DecodingRules.runs_in_graph``), as one graph.

    Inputs: the rows' tokens, positions, finished flags and outputs, the ``min_new_tokens`` and
    ``max_new_tokens`` limits (0-d), when sampling the step's noise (rows, vocab:
    ``DecodingRules.sampling_noise``), then the state as in :class:`_StepGraph`. Outputs: the updated
    tokens, the next positions, finished flags and outputs, and the updated mixer state.
    """

    def __init__(self, model, rules, template: DecodeState) -> None:
        super().__init__()
        self.model, self.rules, self.template = model, rules, template
        self.sampling = rules.config.do_sample

    def forward(self, tokens: Tensor, positions: Tensor, finished: Tensor, outputs: Tensor, min_new_tokens: Tensor,
                max_new_tokens: Tensor, *inputs: Tensor) -> tuple[Tensor, ...]:
        noise, inputs = (inputs[0], inputs[1:]) if self.sampling else (None, inputs)
        assign_state_tensors(self.template, list(inputs))
        rows = Rows(tokens, positions, finished, outputs)
        advance(self.model.eager_step, self.rules.with_length_limits(min_new_tokens, max_new_tokens), self.template,
                rows, noise)
        return (rows.tokens, rows.positions, rows.finished, rows.outputs, *mixer_tensors(self.template))


class _BeamGraph(nn.Module):
    """:func:`hybrid.generation.beams.advance_beams` with rules that run in a graph, as one graph.

    Inputs: the beams' tokens, the tokens generated so far (0-d), the beams' scores, sequences, closed
    flags and the pools' worst scores (:class:`~hybrid.generation.beams.Beams`), the length limits (0-d),
    then the state as in :class:`_StepGraph`. Outputs: the updated tokens, scores, sequences and closed
    flags, the hypotheses that end (scores, sequences, whether any), and the updated, reordered mixer state.
    """

    def __init__(self, model, rules, template: DecodeState) -> None:
        super().__init__()
        self.model, self.rules, self.template = model, rules, template

    def forward(self, tokens: Tensor, generated: Tensor, scores: Tensor, sequences: Tensor, closed: Tensor,
                pool_worst: Tensor, min_new_tokens: Tensor, max_new_tokens: Tensor,
                *state: Tensor) -> tuple[Tensor, ...]:
        assign_state_tensors(self.template, list(state))
        beams = Beams(tokens, scores, sequences, closed, pool_worst, ended_scores=torch.empty_like(scores),
                      ended_sequences=sequences.new_empty(scores.shape[0], scores.shape[1], sequences.shape[1]),
                      any_ended=closed.new_empty(()))
        advance_beams(self.model.eager_step, self.rules.with_length_limits(min_new_tokens, max_new_tokens),
                      self.template, beams, generated)
        return (beams.tokens, beams.scores, beams.sequences, beams.closed, beams.ended_scores, beams.ended_sequences,
                beams.any_ended, *mixer_tensors(self.template))


class OnnxAccelerator(Accelerator):
    """The decoder step of one model run by ONNX Runtime, the state bound in place (see the module's docstring).

    ``quantize="int8"`` quantizes the weights of every matrix product to int8 (ONNX Runtime's
    ``quantize_dynamic``: int8 weights, activations quantized per call). The exported graph holds
    a copy of the weights: :meth:`check_weights` (called by ``Seq2Seq.start``) refuses to run
    after they have changed. With a ``cache_dir``, each graph is read from it when a process has
    exported it before (its key in :attr:`loaded_from_cache`), else exported and written there.

    :attr:`sessions` holds an ONNX Runtime session per exported graph, whose rows and capacity are
    dynamic: the step's, per rows-per-source, and the advance's, per rows-per-source and rules
    (:attr:`~hybrid.generation.rules.DecodingRules.graph_signature`). :attr:`compiled` holds a session's
    binding per (rows, rows per source, capacity): its token, position and logits buffers, bound with a
    state's tensors by address, and bound again only when a state brings other tensors.
    """

    def __init__(self, model, quantize: str | None = None, cache_dir: str | os.PathLike | None = None,
                 threads: int | None = None) -> None:
        check_choice("quantize", quantize, QUANTIZATIONS)
        check_int("threads", threads, at_least=1, optional=True)
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
        super().__init__(model)
        self.quantize = quantize
        self.threads = threads or torch.get_num_threads()  # ONNX Runtime's intra-op threads
        self.sessions: dict[int | tuple, object] = {}
        self.export_seconds: dict[int | tuple, float] = {}  # per graph: its export, or its load from the cache
        self.loaded_from_cache: set = set()
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self._weights_digest = None if cache_dir is None else weights_digest(model)
        self._versions = _weight_versions(model)

    def check_weights(self) -> None:
        """Raise if the model's weights changed since the export (the graph would decode the old ones)."""
        if _weight_versions(self.model) != self._versions:
            raise ValueError("the model's weights changed after optimize_for_inference(); call it again so that "
                             "the fast step decodes the new weights")

    def step(self, tokens: Tensor, state: DecodeState, position: int | Tensor) -> Tensor:
        binding = self._cached(("step", *shape_key(state)),
                               lambda: _StepBinding(self._session(state.group_size), state.batch_size,
                                                    self.model.config.vocab_size))
        binding.bind(state)
        binding.tokens.copy_(tokens)
        if isinstance(position, Tensor):
            binding.positions.copy_(position.expand(binding.positions.shape[0]))
        else:
            binding.positions.fill_(position)
        binding.session.run_with_iobinding(binding.io)
        return binding.logits.clone()  # the bound buffer is overwritten by the next step

    def memory(self, src_ids: Tensor, key_mask: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """``Seq2Seq.eager_memory`` in one call into ONNX Runtime: the encoder and the cross-attention keys and
        values of every layer, once per source (at batch 1 the eager encoder's dispatch costs several times
        its arithmetic, as the step's did). One graph serves every batch and source length."""
        session = self._session("memory")
        arrays = session.run(None, {"src_ids": src_ids.contiguous().numpy(), "key_mask": key_mask.contiguous().numpy()})
        tensors = [torch.from_numpy(array) for array in arrays]
        layers = len(tensors) // 2
        return tensors[:layers], tensors[layers:]

    def advances(self, rules) -> bool:
        """Rules that read only the newest scores and lengths, greedy or sampled, run inside the graph
        (``DecodingRules.runs_in_graph``)."""
        return rules.runs_in_graph

    def advance(self, rules, state: DecodeState, rows: Rows) -> None:
        """:func:`hybrid.generation.stepping.advance` of every row in one call into ONNX Runtime where
        :meth:`advances` says so; else the exported step, with the rules in Python."""
        if not self.advances(rules):
            super().advance(rules, state, rows)
            return
        graph = ("advance", "sample" if rules.config.do_sample else "greedy", *rules.graph_signature, state.group_size)
        binding = self._cached(("advance", *rules.graph_signature, *shape_key(state)),
                               lambda: _AdvanceBinding(self._session(graph, rules), state.batch_size,
                                                       self.model.config.vocab_size if rules.config.do_sample else 0))
        binding.bind(state, rows)
        binding.set_limits(rules)
        if binding.noise is not None:
            rules.sampling_noise(binding.noise)  # drawn as the eager step's torch.multinomial draws it
        binding.session.run_with_iobinding(binding.io)
        rows.positions.copy_(binding.next_positions)  # written apart: nothing else in the graph waits on them

    def advance_beams(self, rules, state: DecodeState, beams: Beams, generated: int) -> None:
        """:func:`hybrid.generation.beams.advance_beams` in one call into ONNX Runtime where :meth:`advances`
        says so; else the exported step, with the rules in Python."""
        if not self.advances(rules):
            super().advance_beams(rules, state, beams, generated)
            return
        graph = ("advance", "beams", *rules.graph_signature, state.group_size)
        binding = self._cached(("beams", *rules.graph_signature, *shape_key(state), beams.sequences.shape[1]),
                               lambda: _BeamBinding(self._session(graph, rules), beams))
        binding.bind(state, beams)
        binding.generated.fill_(generated)
        binding.set_limits(rules)
        binding.session.run_with_iobinding(binding.io)
        beams.sequences.copy_(binding.next_sequences)  # written apart: the hypotheses that end read the old ones
        beams.closed.copy_(binding.next_closed)  # written apart: the choice of those that join reads the old ones

    def _session(self, key, rules=None):
        """The session of ``key``: ``"memory"`` (the encoder), a rows-per-source (the step) or ``("advance",
        "greedy", "sample" or "beams", ...)`` (a whole advance)."""
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
        if key == "memory":
            return self._export_graph(_MemoryGraph(model), *_memory_example(model))
        group_size = key if rules is None else key[-1]
        sources = 2
        src = torch.full((sources, 3), model.config.eos_id, dtype=torch.long, device="cpu")
        template = model.start(src, max_steps=4)
        if group_size > 1:
            template.expand(group_size)
        rows = sources * group_size
        state_inputs = [t.contiguous() for t in state_tensors(template)]
        state_shapes = _dynamic_shapes(template, group_size)
        row_dims = state_shapes[0]
        memory_mask_dims, tensor_dims = state_shapes[2:]  # an advance's state is its forward's *inputs: one tuple
        if rules is not None and key[1] == "beams":
            graph = _BeamGraph(model, rules, template)
            beams = Beams.start(sources, group_size, 5, model.config.bos_id, rules.pad_id, "cpu")
            example = (beams.tokens, torch.tensor(1), beams.scores, beams.sequences, beams.closed, beams.pool_worst,
                       torch.tensor(4), torch.tensor(4), *state_inputs)
            width = torch.export.Dim("width", min=2, max=1 << 20)
            groups = {0: memory_mask_dims[0]}  # the sources
            shapes = (row_dims, {}, groups, {**row_dims, 1: width}, groups, groups, {}, {},
                      (memory_mask_dims, *tensor_dims))
        elif rules is None:
            graph = _StepGraph(model, template)
            example = (torch.full((rows,), model.config.bos_id), torch.zeros(rows, dtype=torch.long), *state_inputs)
            shapes = state_shapes
        else:
            graph = _AdvanceGraph(model, rules, template)
            example_rows = Rows.start(rows, 4, model.config.bos_id, rules.pad_id, "cpu")
            limit = torch.tensor(4)
            noise = [torch.ones(rows, model.config.vocab_size)] if graph.sampling else []
            example = (example_rows.tokens, example_rows.positions, example_rows.finished, example_rows.outputs,
                       limit, limit + 0, *noise, *state_inputs)
            outputs_length = torch.export.Dim("outputs_length", min=2, max=1 << 20)
            shapes = (row_dims, row_dims, row_dims, {**row_dims, 1: outputs_length}, {}, {},
                      (*([row_dims] if graph.sampling else []), memory_mask_dims, *tensor_dims))
        return self._export_graph(graph, example, shapes)

    def _export_graph(self, graph: nn.Module, example: tuple, shapes: tuple) -> bytes:
        """``graph`` exported to ONNX for ``example`` inputs with ``shapes``' dynamic dimensions, quantized if asked."""
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


class _Binding:
    """A session's IO binding of one shape's buffers and of the tensors a state (and rows) bring, by address.

    States come and go (each decode starts one; a reorder or a refill replaces its tensors), so those
    tensors are bound again whenever their addresses or shapes are not the ones bound; the buffers stay.
    """

    def __init__(self, session) -> None:
        self.session, self.io, self.bound = session, None, None

    def _bind(self, inputs: list[Tensor], outputs: list[Tensor]) -> None:
        addresses = [(tensor.data_ptr(), tuple(tensor.shape)) for tensor in [*inputs, *outputs]]
        if addresses == self.bound:
            return
        self.io = self.session.io_binding()
        for name, tensor in zip([node.name for node in self.session.get_inputs()], inputs, strict=True):
            _bind(self.io.bind_input, name, tensor)
        for name, tensor in zip([node.name for node in self.session.get_outputs()], outputs, strict=True):
            _bind(self.io.bind_output, name, tensor)
        self.bound = addresses


class _StepBinding(_Binding):
    """The step's binding: token, position and logits buffers of ``rows`` rows, and a state updated in place."""

    def __init__(self, session, rows: int, vocab_size: int) -> None:
        super().__init__(session)
        self.tokens = torch.zeros(rows, dtype=torch.long)
        self.positions = torch.zeros(rows, dtype=torch.long)
        self.logits = torch.empty(rows, vocab_size)

    def bind(self, state: DecodeState) -> None:
        # Each updated state tensor is written where it was read: in place, as the eager step does.
        self._bind([self.tokens, self.positions, *state_tensors(state)], [self.logits, *mixer_tensors(state)])


class _RulesBinding(_Binding):
    """A binding of a graph that runs the rules: it also binds their length limits (0-d inputs)."""

    def __init__(self, session) -> None:
        super().__init__(session)
        self.limits = (torch.zeros((), dtype=torch.long), torch.zeros((), dtype=torch.long))
        self._limits: tuple[int, int] | None = None

    def set_limits(self, rules) -> None:
        """``rules``' ``min_new_tokens`` and ``max_new_tokens``, written only when they change."""
        if self._limits != (rules.min_new_tokens, rules.max_new_tokens):
            self.limits[0].fill_(rules.min_new_tokens)
            self.limits[1].fill_(rules.max_new_tokens)
            self._limits = (rules.min_new_tokens, rules.max_new_tokens)


class _AdvanceBinding(_RulesBinding):
    """The advance's binding of rows and a state, all updated in place but the next positions, and when
    sampling (``vocab_size`` > 0) of a noise buffer that each call draws into."""

    def __init__(self, session, rows: int, vocab_size: int) -> None:
        super().__init__(session)
        self.next_positions = torch.empty(rows, dtype=torch.long)
        self.noise = torch.empty(rows, vocab_size) if vocab_size else None

    def bind(self, state: DecodeState, rows: Rows) -> None:
        # The positions' update depends on no other result of the step, so ONNX Runtime may compute it
        # first: written over its input, it would move every later read. It gets a buffer of its own.
        noise = [] if self.noise is None else [self.noise]
        self._bind([rows.tokens, rows.positions, rows.finished, rows.outputs, *self.limits, *noise,
                    *state_tensors(state)],
                   [rows.tokens, self.next_positions, rows.finished, rows.outputs, *mixer_tensors(state)])


class _BeamBinding(_RulesBinding):
    """The beam advance's binding of beams and a state, all updated in place but the sequences and closed
    flags, which ONNX Runtime may write before the graph's last read of them, so they get buffers of their own."""

    def __init__(self, session, beams: Beams) -> None:
        super().__init__(session)
        self.generated = torch.zeros((), dtype=torch.long)
        self.next_sequences = torch.empty_like(beams.sequences)
        self.next_closed = torch.empty_like(beams.closed)

    def bind(self, state: DecodeState, beams: Beams) -> None:
        self._bind([beams.tokens, self.generated, beams.scores, beams.sequences, beams.closed, beams.pool_worst,
                    *self.limits, *state_tensors(state)],
                   [beams.tokens, beams.scores, self.next_sequences, self.next_closed, beams.ended_scores,
                    beams.ended_sequences, beams.any_ended, *mixer_tensors(state)])


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
    if key == "memory":  # the encoder and the cross-attention keys and values
        kind = "memory"
    elif isinstance(key, tuple):  # ("advance", "greedy", "sample" or "beams", *rules.graph_signature, rows per source)
        kind = f"{key[1]}-rows{key[-1]}"
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
    package = Path(__file__).parents[1]  # hybrid/, not hybrid/accel/
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


def _memory_example(model) -> tuple[tuple[Tensor, Tensor], tuple]:
    """Example inputs of :class:`_MemoryGraph` (two sources of five tokens, one padded) and their dynamic shapes."""
    src_ids = torch.full((2, 5), model.config.eos_id, dtype=torch.long)
    key_mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    key_mask[1, ..., 3:] = False
    sources = torch.export.Dim("sources", min=1, max=1 << 20)
    length = torch.export.Dim("source_length", min=1, max=1 << 20)
    return (src_ids, key_mask), ({0: sources, 1: length}, {0: sources, 3: length})


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
