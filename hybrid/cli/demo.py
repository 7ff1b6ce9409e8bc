"""``hybrid demo``: time greedy decoding of small random LSTM and attention decoders (:mod:`hybrid.bench.demo`)."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from hybrid.bench.demo import demo


def run_demo(cfg: DictConfig) -> None:
    """Run the demo with the settings of ``cfg`` (the composed ``demo.yaml``), which are its keyword arguments."""
    demo(**OmegaConf.to_container(cfg, resolve=True))
