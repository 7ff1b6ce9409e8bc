"""Where a decode step spends its time: torch.profiler with labels around each part of the step.

The labels are attached only while profiling (by wrapping the parts' methods on the
instances), so the decode path carries no profiling cost in normal use.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PARTS = ("mixer", "cross-attention", "ffn", "head", "choose-token")


@contextlib.contextmanager
def _labelled(model):
    """Wrap the step's parts in ``record_function`` labels for the duration of the block."""
    wrapped = []

    def label(owner, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def call(*args, **kwargs):
            with record_function(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, call)
        wrapped.append((owner, attribute))

    for layer in model.decoder_layers:
        label(layer.mixer, "step", "mixer")
        label(layer.cross, "forward", "cross-attention")
        label(layer.ffn.fc_in, "forward", "ffn")
        label(layer.ffn.fc_out, "forward", "ffn")
    label(model.lm_head, "forward", "head")
    try:
        yield
    finally:
        for owner, attribute in wrapped:
            delattr(owner, attribute)  # the instance attribute hid the class method; remove it


def profile_decoding(model, src: torch.Tensor, position: int, steps: int = 32) -> dict[str, float]:
    """Milliseconds per step spent in each labelled part, decoding ``steps`` tokens from ``position`` on.

    The state is filled up to ``position`` first, so a KV cache is as long as it would be
    at that point of a real decode.
    """
    # Kineto, the profiler's tracer, prints "profiler_start" and "profiler_stop" lines to stderr at its USDT
    # level, which ranks above its errors, so only a log level above both keeps a profile quiet. It reads
    # the level once, when the process's first profile starts; a level the user set is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if src.is_cuda else [])
    state = model.start(src, max_steps=position + steps)
    tokens = torch.full((src.shape[0],), model.config.bos_id, dtype=torch.long, device=src.device)
    with torch.inference_mode():
        for _ in range(position):
            model.step_unchecked(tokens, state)
        with _labelled(model), profile(activities=activities) as profiler:
            for _ in range(steps):
                with record_function("step"):
                    logits = model.step_unchecked(tokens, state)
                with record_function("choose-token"):
                    tokens = logits.argmax(dim=-1)
    totals = {name: 0.0 for name in ("step", *PARTS)}
    for event in profiler.key_averages():
        if event.key in totals:
            totals[event.key] += event.cpu_time_total / 1000.0 / steps
    totals["other (embedding, norms, residuals, overhead)"] = totals["step"] - sum(
        totals[name] for name in PARTS if name != "choose-token")
    return totals
