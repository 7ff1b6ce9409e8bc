"""Node count and fixed cost per token of the fast path's greedy advance on the d_model-16 model, with and without
onnxruntime.transformers.optimizer run over the exported graph (interleaved, 1 thread): `python nodes.py [mixer]`.
"""

import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import onnx
import onnxruntime
import torch

from hybrid import ModelConfig, Seq2Seq
from hybrid.accel import onnx as accel_onnx

torch.set_num_threads(1)
torch.manual_seed(0)
mixer = sys.argv[1] if sys.argv[1:] else "lstm"
config = ModelConfig(vocab_size=128, d_model=16, n_heads=2, d_ff=32, encoder_layers=3, decoder_layers=3,
                     decoder_mixers=[mixer] * 3, max_positions=4096, dropout=0.0)
src = torch.randint(3, 128, (1, 32))
reference = Seq2Seq(config).eval()
exported: dict = {}  # graph key -> the graph: the encoder's ("memory"), then the greedy advance's
original_open, original_export = accel_onnx.OnnxAccelerator._open, accel_onnx.OnnxAccelerator._export


def export(self, key, rules):
    graph = original_export(self, key, rules)
    exported[key] = graph
    return graph


def transformer_optimized(graph: bytes) -> bytes:
    from onnxruntime.transformers.optimizer import optimize_model

    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "in.onnx").write_bytes(graph)
        optimize_model(str(Path(folder, "in.onnx")), model_type="bert", num_heads=config.n_heads,
                       hidden_size=config.d_model, opt_level=0).save_model_to_file(str(Path(folder, "out.onnx")))
        return Path(folder, "out.onnx").read_bytes()


def node_counts(graph: bytes, label: str) -> None:
    """Nodes as exported, and after ONNX Runtime's own optimisations (what a session runs)."""
    with tempfile.TemporaryDirectory() as folder:
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(folder, "optimized.onnx"))
        onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    ops = collections.Counter(node.op_type for node in optimized.graph.node)
    print(f"{label}: {len(onnx.load_from_string(graph).graph.node)} nodes exported, {len(optimized.graph.node)} "
          f"after ONNX Runtime's own optimisation; most common: {ops.most_common(8)}")


def fast_model(variant: str) -> Seq2Seq:
    model = Seq2Seq(config).eval()
    model.load_state_dict(reference.state_dict())
    model.optimize_for_inference()
    if variant == "transformers-optimizer":
        model.accelerator._open = lambda graph: original_open(model.accelerator, transformer_optimized(graph))
    model.generate(src, max_new_tokens=32, min_new_tokens=32)  # the export, and a warm-up
    return model


accel_onnx.OnnxAccelerator._export = export
models = {variant: fast_model(variant) for variant in ("plain", "transformers-optimizer")}
advance = next(graph for key, graph in exported.items() if isinstance(key, tuple) and key[0] == "advance")
node_counts(advance, "plain")
node_counts(transformer_optimized(advance), "transformers-optimizer")
decode = dict(max_new_tokens=256, min_new_tokens=256)
assert torch.equal(models["transformers-optimizer"].generate(src, **decode), models["plain"].generate(src, **decode))
times = {variant: [] for variant in models}
for _ in range(9):
    for variant, model in models.items():
        begin = time.perf_counter()
        model.generate(src, **decode)
        times[variant].append((time.perf_counter() - begin) / 256 * 1e3)
for variant, values in times.items():
    print(f"{mixer} {variant}: {statistics.median(values):.4f} ms/token (median of 9, interleaved; "
          f"min {min(values):.4f}, max {max(values):.4f})")
