"""A fit killed mid-epoch (SIGKILL, by its own PID) and resumed ends bit-identical to one never interrupted.

Three runs of the same command, with dropout on and a checkpoint every 2 steps (4 steps an epoch):
one straight through 3 epochs; one that kills itself half-way through step 7 (gradients computed,
the optimiser not yet stepped), so its newest checkpoint is step 6, two batches into the second
epoch; and that one resumed with ``ckpt_path=last``. The resumed run must see the batches the
killed epoch had left, in the same order, with the same dropout masks, learning rates and Adam
moments: its final weights must equal the uninterrupted run's, tensor by tensor.
"""

import signal
import subprocess
import sys
import textwrap

import torch
from test_cli_train import TINY, hybrid, run_folders

CHILD = textwrap.dedent('''
    import os, signal, sys
    from lightning.pytorch.callbacks import Callback

    class KillMidStep(Callback):
        """SIGKILL after the backward pass of the step after `step`, before the optimiser steps."""

        def __init__(self, step):
            self.step = step

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            if trainer.global_step == self.step:
                os.kill(os.getpid(), signal.SIGKILL)

    from hybrid.cli import main
    main(sys.argv[1:])
''')

RUN = [*TINY, "model.dropout=0.2", "trainer.max_epochs=3", "callbacks.last_checkpoint.every_n_train_steps=2"]


def test_a_fit_killed_mid_epoch_resumes_to_the_same_weights_as_an_uninterrupted_one(tmp_path):
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    straight.mkdir(), interrupted.mkdir()
    hybrid("fit", *RUN, cwd=straight)

    script = interrupted / "child.py"
    script.write_text(CHILD)
    child = subprocess.run([sys.executable, str(script), "fit", *RUN,
                            "+callbacks.kill._target_=__main__.KillMidStep", "+callbacks.kill.step=6"],
                           cwd=interrupted, capture_output=True, text=True, timeout=180)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    (killed,) = run_folders(interrupted)
    saved = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)
    batches = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["processed"]
    assert (saved["global_step"], saved["epoch"], batches) == (6, 1, 2)  # mid-epoch, as intended

    hybrid("fit", *RUN, "ckpt_path=last", cwd=interrupted)
    (resumed,) = [folder for folder in run_folders(interrupted) if folder != killed]
    expected = torch.load(run_folders(straight)[0] / "checkpoints" / "last.ckpt", weights_only=True)
    actual = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert actual["global_step"] == expected["global_step"] == 12
    assert actual["state_dict"].keys() == expected["state_dict"].keys()
    different = [name for name, tensor in expected["state_dict"].items()
                 if not torch.equal(tensor, actual["state_dict"][name])]
    assert not different, f"{len(different)} of {len(expected['state_dict'])} tensors differ, e.g. {different[:3]}"
