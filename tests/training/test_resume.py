"""A fit killed with SIGKILL (by its own PID) and resumed with ``ckpt_path=last`` ends bit-identical to one
never interrupted, wherever it was killed, and continues in the run folder it was killed in.

Every fit here trains the same way: dropout on, a budget of ``max_steps`` (3 epochs of 4 steps), under which
Lightning's loop replays a finished epoch when it resumes from the checkpoint written at that epoch's end (issue
27's failing case), and ``last.ckpt`` after every validation (and every 2 steps, where a case needs a checkpoint
between validations; that changes no step). One fit runs straight through (shared by every case); each case
kills another at one point and resumes it. The resumed run must see the batches the killed one had left, in the
same order, with the same dropout masks, learning rates and Adam moments: its final weights and optimiser state
must equal the uninterrupted run's, tensor by tensor.
"""

import csv
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_cli_train import TINY, hybrid, run_folders

from hybrid.cli.resume import resume_overrides
from hybrid.training.builders import newest_last_checkpoint
from hybrid.training.loggers import ContinuingCSVLogger

CHILD = textwrap.dedent('''
    import os, signal, sys
    from lightning.pytorch.callbacks import Callback

    class KillAt(Callback):
        """SIGKILL at the callback hook `hook` (Lightning's name) while the global step is `step`."""

        def __init__(self, hook, step):
            self.step = step
            setattr(self, hook, self.kill)

        def kill(self, trainer, *args, **kwargs):
            if trainer.global_step == self.step and not trainer.sanity_checking:
                os.kill(os.getpid(), signal.SIGKILL)

    from hybrid.cli import main
    main(sys.argv[1:])
''')

RUN = [*TINY, "model.dropout=0.2", "trainer.max_epochs=-1", "trainer.max_steps=12"]
EVERY_2_STEPS = ["callbacks.last_checkpoint.every_n_train_steps=2"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The final ``last.ckpt`` of the fit run straight through."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    result = hybrid("fit", *RUN, cwd=cwd)
    (run,) = run_folders(cwd)
    # The console says where the run and its checkpoints are.
    assert str(run) in result.stderr and str(run / "checkpoints" / "last.ckpt") in result.stderr
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def kill(cwd: Path, hook: str, step: int, *extra: str) -> Path:
    """Run the fit (with ``extra`` overrides) in ``cwd``, SIGKILLed at ``hook`` of global step ``step``;
    returns its run folder."""
    (cwd / "child.py").write_text(CHILD)
    child = subprocess.run([sys.executable, "child.py", "fit", *RUN, *extra, "+callbacks.kill._target_=__main__.KillAt",
                            f"+callbacks.kill.hook={hook}", f"+callbacks.kill.step={step}"],
                           cwd=cwd, capture_output=True, text=True, timeout=180)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    (killed,) = run_folders(cwd)
    return killed


def position(checkpoint: Path) -> tuple[int, int, int]:
    """(global step, epoch, training batches done in that epoch) of a checkpoint."""
    saved = torch.load(checkpoint, weights_only=True)
    return saved["global_step"], saved["epoch"], saved["SyntheticDataModule"]["train_position"]["batches_yielded"]


def resume_and_compare(cwd: Path, killed: Path, uninterrupted: dict, *extra: str) -> None:
    """Resume with ``ckpt_path=last`` in ``cwd``; the fit must continue in ``killed`` and end where the
    uninterrupted one did, every weight, Adam moment and schedule state equal."""
    record, log = (killed / ".hydra" / "config.yaml").read_text(), (killed / "fit.log").read_text()
    resumed_from = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    folders = run_folders(cwd)
    result = hybrid("fit", *RUN, *extra, "ckpt_path=last", cwd=cwd)
    assert run_folders(cwd) == folders  # no new run folder: the fit continued in the killed one
    resumed_log = (killed / "fit.log").read_text()
    assert resumed_log.startswith(log) and "resuming" in resumed_log[len(log):]  # the run's log, continued
    assert "dirpath has changed" not in result.stderr + resumed_log
    assert (killed / ".hydra" / "config.yaml").read_text() == record  # the run's own record kept...
    assert len(list((killed / ".hydra").glob("resume_*/config.yaml"))) == 1  # ...and this attempt's beside it
    actual = torch.load(killed / "checkpoints" / "last.ckpt", weights_only=True)
    assert actual["global_step"] == uninterrupted["global_step"] == 12
    assert actual["state_dict"].keys() == uninterrupted["state_dict"].keys()
    different = [name for name, tensor in uninterrupted["state_dict"].items()
                 if not torch.equal(tensor, actual["state_dict"][name])]
    assert not different, f"{len(different)} of {len(actual['state_dict'])} tensors differ, e.g. {different[:3]}"
    (expected_adam,), (actual_adam,) = uninterrupted["optimizer_states"], actual["optimizer_states"]
    for index, moments in expected_adam["state"].items():
        for name, tensor in moments.items():
            assert torch.equal(tensor, actual_adam["state"][index][name]), f"Adam's {name} of parameter {index}"
    assert actual["lr_schedulers"] == uninterrupted["lr_schedulers"]
    with open(killed / "csv" / "metrics.csv") as file:
        steps = [int(row["step"]) for row in csv.DictReader(file) if row.get("train/loss_step")]
    # One metrics file: the killed attempt's rows up to its checkpoint, then the resumed fit's, each step once.
    # (Lightning logs the steps after an epoch-end resume under max_steps one later: 0-7, then 9-12.)
    assert steps[:resumed_from] == list(range(resumed_from))
    assert len(steps) == 12 and steps == sorted(set(steps))


def test_a_fit_killed_mid_epoch_resumes_to_the_uninterrupted_fit(uninterrupted, tmp_path):
    # Half-way through step 7 (gradients computed, the optimiser not yet stepped): the newest checkpoint
    # is step 6, two batches into the second epoch.
    killed = kill(tmp_path, "on_before_optimizer_step", 6, *EVERY_2_STEPS)
    assert position(killed / "checkpoints" / "last.ckpt") == (6, 1, 2)
    resume_and_compare(tmp_path, killed, uninterrupted, *EVERY_2_STEPS)


def test_a_fit_killed_at_an_epochs_end_after_its_validation_resumes_to_the_uninterrupted_fit(uninterrupted, tmp_path):
    # As the third epoch starts: the newest checkpoint is the one the second epoch's validation wrote.
    killed = kill(tmp_path, "on_train_epoch_start", 8)
    assert position(killed / "checkpoints" / "last.ckpt") == (8, 1, 4)
    resume_and_compare(tmp_path, killed, uninterrupted)


def test_ckpt_path_last_resumes_the_run_written_last_among_several(uninterrupted, tmp_path):
    # Killed during the second epoch's validation: the newest checkpoint is step 8's, written before it.
    killed = kill(tmp_path, "on_validation_batch_start", 8, *EVERY_2_STEPS)
    assert position(killed / "checkpoints" / "last.ckpt") == (8, 1, 4)
    # Another run of the same name, started later and trained further, but left alone since: by its start
    # or by its step it would be the newest; by when its last.ckpt was written, it is not.
    other = killed.parent / "9999-12-31_23-59-59"
    shutil.copytree(killed, other)
    torch.save(uninterrupted, other / "checkpoints" / "last.ckpt")
    an_hour_earlier = (killed / "checkpoints" / "last.ckpt").stat().st_mtime - 3600
    os.utime(other / "checkpoints" / "last.ckpt", (an_hour_earlier, an_hour_earlier))
    resume_and_compare(tmp_path, killed, uninterrupted, *EVERY_2_STEPS)


def test_the_newest_last_checkpoint_is_the_one_written_last_then_the_run_started_last(tmp_path):
    def checkpoint(run: str, mtime: int) -> Path:
        path = tmp_path / run / "checkpoints" / "last.ckpt"
        path.parent.mkdir(parents=True)
        path.touch()
        os.utime(path, ns=(mtime, mtime))
        return path

    assert newest_last_checkpoint(tmp_path) is None
    checkpoint("2026-01-02_00-00-00", 10)
    written_last = checkpoint("2026-01-01_00-00-00", 20)
    assert newest_last_checkpoint(tmp_path) == written_last
    started_last = checkpoint("2026-01-03_00-00-00", 20)
    assert newest_last_checkpoint(tmp_path) == started_last


def test_a_resumed_fit_continues_in_its_checkpoints_run_folder_only(tmp_path, monkeypatch):
    run = tmp_path / "outputs" / "copy_hybrid" / "2026-01-01_00-00-00"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("name: copy_hybrid\n")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.ckpt").touch()
    (tmp_path / "loose.ckpt").touch()
    resumed = resume_overrides("config", [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "trainer.max_epochs=2"])
    assert resumed == [f"hydra.run.dir='{run}'", "hydra.output_subdir=.hydra/resume_${now:%Y-%m-%d_%H-%M-%S}"]
    monkeypatch.chdir(tmp_path)  # ckpt_path=last looks under paths.run_dir: outputs/<name> of the folder it runs in
    assert resume_overrides("config", ["experiment=copy_hybrid", "ckpt_path=last"]) == resumed
    for not_a_resume_of_that_run in (
        [f"ckpt_path={tmp_path / 'loose.ckpt'}"],  # a checkpoint outside a run folder: a new run folder
        [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "hydra.run.dir=elsewhere"],  # the user's choice
        [f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}", "--cfg", "job"],  # runs nothing
        ["experiment=copy_hybrid"],  # resumes nothing
        ["experiment=reverse_hybrid", "ckpt_path=last"],  # no run of that name
    ):
        assert resume_overrides("config", not_a_resume_of_that_run) == [], not_a_resume_of_that_run


def test_the_csv_logger_keeps_the_rows_before_the_step_a_resumed_fit_starts_from(tmp_path):
    def log(rows: dict[int, float]) -> list[dict[str, str]]:
        logger = ContinuingCSVLogger(tmp_path, name="csv", version="")
        for step, loss in rows.items():
            logger.log_metrics({"train/loss": loss}, step=step)
        logger.save()
        with open(tmp_path / "csv" / "metrics.csv") as file:
            return [{key: value for key, value in row.items() if value} for row in csv.DictReader(file)]

    log({0: 3.0, 1: 2.0, 2: 1.5, 3: 1.4})  # killed after step 3; its checkpoint is at step 2
    assert log({2: 1.0, 3: 0.5}) == [{"step": "0", "train/loss": "3.0"}, {"step": "1", "train/loss": "2.0"},
                                     {"step": "2", "train/loss": "1.0"}, {"step": "3", "train/loss": "0.5"}]
    assert log({0: 9.0}) == [{"step": "0", "train/loss": "9.0"}]  # a fresh fit in that folder: a file of its own
