"""ONNX Runtime's kernel time per decoding step, summed by operator type, for one `generate` on the fast path.

`python results/fast-strategies/profile_onnx.py attention 32 64 4` profiles the attention decoder at 32 sources x 64
new tokens with 4 beams (1 thread, the bench's default shape): what profile-attention-beam4.md quotes.
"""

import collections
import json
import sys
import tempfile

import onnxruntime
import torch

from hybrid import ModelConfig, Seq2Seq
from hybrid.accel import onnx as accel_onnx

torch.set_num_threads(1)
torch.manual_seed(0)
mixer = sys.argv[1]
batch, tokens, num_beams = (int(value) for value in sys.argv[2:5])
folder = tempfile.mkdtemp()


def profiled_session(self, graph: bytes):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling, options.profile_file_prefix = True, f"{folder}/{mixer}"
    return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


accel_onnx.OnnxAccelerator._open = profiled_session
config = ModelConfig(vocab_size=128, d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3,
                     decoder_mixers=[mixer] * 3, max_positions=4096, dropout=0.0)
model = Seq2Seq(config).eval().optimize_for_inference()
model.generate(torch.randint(3, 128, (batch, 32)), max_new_tokens=tokens, min_new_tokens=tokens, num_beams=num_beams)
events = json.loads(open(next(iter(model.accelerator.sessions.values())).end_profiling()).read())
kernel_us, nodes = collections.Counter(), collections.Counter()
for event in events:
    if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
        kernel_us[event["args"]["op_name"]] += event["dur"]
        nodes[event["args"]["op_name"]] += 1
steps = sum(1 for event in events if event.get("name") == "model_run")
print(f"{mixer}, {batch} x {tokens}, {num_beams} beams: {steps} steps, {sum(nodes.values()) / steps:.0f} nodes and "
      f"{sum(kernel_us.values()) / steps / 1e3:.1f} ms of kernels per step")
for op, us in kernel_us.most_common(12):
    print(f"  {op:24s} {us / steps / 1e3:7.2f} ms per step, {nodes[op] / steps:.0f} nodes")
