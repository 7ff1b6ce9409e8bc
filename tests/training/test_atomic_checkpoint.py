"""A fit killed (SIGKILL, by its own PID) while it writes a checkpoint keeps the previous one loadable.

The child process runs `hybrid fit` with ``torch.save`` wrapped: at the second epoch's first
checkpoint it writes half of the serialised bytes to the file it was given, syncs them and kills
itself, so the kill lands in the middle of a checkpoint on disk. The baseline (a CheckpointIO that
``torch.save``s straight to the target, as a plain write would) shows that the kill does break a
checkpoint; the Trainer's configured one (``AtomicCheckpointIO``) must leave the old one whole.
"""

import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from test_cli_train import TINY, hybrid, run_folders

CHILD = textwrap.dedent('''
    import io, os, signal, sys
    import torch
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("global_step") == 8 and not isinstance(f, io.BytesIO):
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            with open(f, "wb") as out:
                out.write(data[: len(data) // 2])
                out.flush()
                os.fsync(out.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *args, **kwargs)

    torch.save = save

    class DirectCheckpointIO(TorchCheckpointIO):  # the baseline: writes over the target in place
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(checkpoint, path)

    from hybrid.cli import main
    main(sys.argv[1:])
''')


@pytest.mark.parametrize("writer", ["configured", "direct"])
def test_a_kill_during_a_checkpoint_write_keeps_the_last_one_loadable(writer, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    plugins = ["trainer.plugins=[{_target_: __main__.DirectCheckpointIO}]"] if writer == "direct" else []
    child = subprocess.run([sys.executable, str(script), "fit", *TINY, "trainer.max_epochs=2", *plugins],
                           cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    (run,) = run_folders(tmp_path)
    checkpoints = run / "checkpoints"
    if writer == "direct":  # the kill really lands mid-write: a plain write leaves a broken checkpoint
        broken = [path for path in checkpoints.glob("*.ckpt") if _unloadable(path)]
        assert broken, "the baseline's half-written checkpoint should not load"
        return
    last = torch.load(checkpoints / "last.ckpt", weights_only=True)
    assert last["global_step"] == 4  # the first epoch's, whole
    visible = [path for path in checkpoints.glob("*.ckpt") if not path.name.startswith(".")]
    assert visible and not [path for path in visible if _unloadable(path)]
    # The kill landed in the write: its half-written temporary file is still there, hidden, never renamed.
    assert [path for path in checkpoints.glob(".*.tmp.ckpt") if _unloadable(path)]
    # And the run resumes from it.
    hybrid("fit", *TINY, "trainer.max_epochs=2", f"ckpt_path={checkpoints / 'last.ckpt'}", cwd=tmp_path)


def _unloadable(path) -> bool:
    try:
        torch.load(path, weights_only=True)
    except Exception:
        return True
    return False
