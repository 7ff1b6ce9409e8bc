"""Where ``configs/experiment``'s ``training_clock`` still finds :class:`~hybrid.training.callbacks.TrainingClock`.

Delete this file in the commit that points those configs at ``hybrid.training.callbacks.TrainingClock``: fits
started from them meanwhile (results/dropout-once/run.sh) resolve the callback through this path.
"""

from hybrid.training.callbacks import TrainingClock

__all__ = ["TrainingClock"]
