"""Training health numbers: data wait vs compute per step, per-worker step time, process RSS.

Each worker keeps a window of its own steps (`StepWindow`); every `health_every` steps the job
gathers one row per worker (a tiny all-gather) and worker 0 alone publishes the result with
its heartbeat, so a job of any size still writes one Lease. `Health` is what is published.

A worker's step time here is its *host* time: the step's wall time minus its data wait and
minus the time it spent blocked on the device result. In a data-parallel step every worker
waits for the slowest one in the collective, so wall times are equal across workers; the host
time is what differs when one host is slow (CPU contention, a noisy neighbour, slow host-side
code). A slow input pipeline shows in that worker's input-bound fraction instead.
"""

from __future__ import annotations

import os
import resource
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW_STEPS = 50


def rss_bytes() -> int:
    """This process's resident set size now (Linux), else its peak (other Unixes)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class StepTiming:
    """One step of one worker: seconds waiting for data, on the host (neither waiting for data
    nor blocked on the device), and in all."""

    data_wait: float
    host: float
    wall: float


class StepWindow:
    """The last `size` steps of this worker."""

    def __init__(self, size: int = WINDOW_STEPS) -> None:
        self._steps: deque[StepTiming] = deque(maxlen=max(1, size))

    def record(self, timing: StepTiming) -> None:
        """Add one step."""
        self._steps.append(timing)

    def input_bound_fraction(self) -> float:
        """The share of wall time spent waiting for data over the window (0 when empty)."""
        wall = sum(t.wall for t in self._steps)
        return min(1.0, sum(t.data_wait for t in self._steps) / wall) if wall > 0 else 0.0

    def mean_host_seconds(self) -> float:
        """The mean host seconds per step over the window (0 when empty)."""
        return sum(t.host for t in self._steps) / len(self._steps) if self._steps else 0.0

    def row(self, rss: int) -> list[float]:
        """This worker's row of the gather: input-bound fraction, host seconds, RSS in MiB."""
        # MiB, because the gather carries float32: bytes would lose their low digits.
        return [self.input_bound_fraction(), self.mean_host_seconds(), rss / (1 << 20)]


@dataclass(frozen=True)
class Health:
    """The job's health after one gather, in process-id order."""

    step: int
    worker_input_bound: tuple[float, ...]
    worker_step_seconds: tuple[float, ...]
    worker_rss_bytes: tuple[int, ...]

    @property
    def input_bound_fraction(self) -> float:
        """The job's input-bound fraction: the mean over workers."""
        values = self.worker_input_bound
        return sum(values) / len(values) if values else 0.0


def from_rows(step: int, rows: Sequence[Sequence[float]]) -> Health:
    """Pure: the `Health` of every worker's gathered row (see `StepWindow.row`)."""
    return Health(
        step=step,
        worker_input_bound=tuple(round(r[0], 4) for r in rows),
        worker_step_seconds=tuple(round(r[1], 4) for r in rows),
        worker_rss_bytes=tuple(int(r[2] * (1 << 20)) for r in rows),
    )
