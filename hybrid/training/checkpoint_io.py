"""Lightning's checkpoint writes made atomic: the Trainer's checkpoint plugin (``configs/trainer/default.yaml``).

Kept apart from :mod:`hybrid.training.checkpoint`, which reads checkpoints for inference without Lightning.
"""

from __future__ import annotations

from pathlib import Path

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO

from hybrid.files import write_atomically


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writes (``last.ckpt``, the best ones, ``trainer.save_checkpoint``), made atomic.

    Lightning's own ``TorchCheckpointIO`` serialises to memory and then writes over the target in
    place, so a kill during that write leaves a truncated ``last.ckpt`` and no previous one. Here the
    checkpoint goes to a temporary file beside the target, is fsynced and renamed over it
    (:func:`hybrid.files.write_atomically`): a reader sees the old checkpoint or the whole new one.
    Remote targets (``s3://`` and the like) keep Lightning's write, as their stores replace objects
    whole. Set in ``configs/trainer/default.yaml`` as the Trainer's plugin.
    """

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        protocol = get_filesystem(path).protocol  # "file", or ("file", "local"), for a local path
        if storage_options is not None or "file" not in ((protocol,) if isinstance(protocol, str) else protocol):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda temporary: torch.save(checkpoint, temporary))
