"""Non-finite loss and loss spikes: the check every step's loss goes through (pure).

A NaN or infinite loss means the parameters are already garbage, so training must stop at that
step rather than save it: `LossGuard.check` raises `NonFiniteLossError` (exit code
NON_FINITE_LOSS, with the step in the termination message), and the operator rolls the job
back to a checkpoint before it and skips the data window (see `rollback`).

Optionally a spike counts too: a loss above `spike_factor` times the running median of the last
`window` losses, once the window is full. Off by default: a spike is not always a failure (a
new data shard, a learning-rate schedule step), so a user opts in with a factor that fits.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections import deque
from dataclasses import dataclass

from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import TrainerError


class Anomaly(enum.StrEnum):
    """What is wrong with a loss."""

    NAN = "nan"
    INFINITE = "inf"
    SPIKE = "spike"


ADVICE = (
    "lower the learning rate or lengthen its warmup, clip gradients (optax.clip_by_global_norm), "
    "use loss scaling for low-precision training, and check the skipped batches for bad records"
)


class NonFiniteLossError(TrainerError):
    """The loss of `step` is NaN, infinite, or (when enabled) a spike."""

    def __init__(self, step: int, loss: float, anomaly: Anomaly, median: float | None) -> None:
        against = f" (running median {median:.6g})" if median is not None else ""
        super().__init__(
            ExitCode.NON_FINITE_LOSS,
            f"loss at step {step} is {anomaly} ({loss!r}{against}); {ADVICE}",
        )
        self.step = step
        self.loss = loss
        self.anomaly = anomaly


@dataclass
class LossGuard:
    """Checks each step's loss; keeps the window the spike test needs."""

    spike_factor: float | None = None
    window: int = 50

    def __post_init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=max(2, self.window))

    def check(self, step: int, loss: float) -> None:
        """Raise `NonFiniteLossError` when `loss` is NaN, infinite or a spike."""
        if math.isnan(loss):
            raise NonFiniteLossError(step, loss, Anomaly.NAN, None)
        if math.isinf(loss):
            raise NonFiniteLossError(step, loss, Anomaly.INFINITE, None)
        if self.spike_factor is not None and len(self._recent) == self._recent.maxlen:
            median = statistics.median(self._recent)
            if median > 0 and loss > self.spike_factor * median:
                raise NonFiniteLossError(step, loss, Anomaly.SPIKE, median)
        self._recent.append(loss)
