"""The metrics log of a run that a resumed fit continues: ``<run folder>/csv/metrics.csv``.

A fit resumed with ``ckpt_path`` continues in the run folder its checkpoint belongs to (``hybrid fit``
picks it, :mod:`hybrid.cli.resume`), so its metrics belong in the same file as the run's earlier ones.
Lightning's own CSV logger deletes the file it finds there.
"""

from __future__ import annotations

import csv

from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment


class ContinuingCSVLogger(LightningCSVLogger):
    """Lightning's ``CSVLogger``, except that it continues the ``metrics.csv`` it finds instead of deleting it.

    The rows an earlier attempt logged before the step this fit starts logging from are kept; the rest are
    steps this fit trains again (a fit killed after its checkpoint), and its own rows replace them. So a
    resumed run's file reads as one uninterrupted run's, and a fresh fit (which starts at step 0) writes a
    file of its own, as Lightning's logger does. Set in ``configs/logger/csv.yaml``.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ContinuingWriter(log_dir=self.log_dir)
        return self._experiment


class _ContinuingWriter(ExperimentWriter):
    """Lightning's writer, keeping the earlier rows of ``metrics.csv`` that precede its first row's step."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self.continuing = self._fs.isfile(self.metrics_file_path)

    def _check_log_dir_exists(self) -> None:
        """Keep what the folder holds (Lightning's writer deletes ``metrics.csv`` here, with a warning)."""

    def save(self) -> None:
        if self.continuing and self.metrics:
            self.continuing = False
            self._keep_rows_before(min(int(row["step"]) for row in self.metrics))
        super().save()

    def _keep_rows_before(self, step: int) -> None:
        with self._fs.open(self.metrics_file_path, "r", newline="") as file:
            reader = csv.DictReader(file)
            rows = [row for row in reader if row.get("step") and int(row["step"]) < step]
            # Sorted, as Lightning keeps its columns: super().save() appends rows in that order.
            self.metrics_keys = sorted(reader.fieldnames or [])
        if not rows:  # nothing of it precedes this fit: a file of its own, as Lightning's logger writes
            self.metrics_keys = []
            self._fs.rm_file(self.metrics_file_path)
            return
        with self._fs.open(self.metrics_file_path, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self.metrics_keys)
            writer.writeheader()
            writer.writerows(rows)

