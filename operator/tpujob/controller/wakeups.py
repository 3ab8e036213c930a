"""Whom an event concerns: which job daemons a pod, node, heartbeat or freed pool wakes.

One operator serves thousands of jobs. A node's status update wakes the few jobs with pods on
that node or a placement on its pool, never all of them; a pool that frees up wakes the job
that has waited longest for that TPU shape (first come, first placed; the others keep their
own poll), not every waiting job at once; a job's heartbeat, which trainers renew every few
seconds, wakes it at once only when a new attempt reports for the first time (recovery time is
measured from it) or a supervisor reports a training process that ended (its pod is held for
the verdict), and otherwise at most once per `progress_interval_seconds` (the status shows
progress that fresh, no fresher). Finished jobs are woken only by their own pods.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from tpujob.observed.views import Heartbeat

JobKey = tuple[str, str]
Shape = tuple[str, str]  # (accelerator, topology)


@dataclass
class WakeBook:
    progress_interval_seconds: float = 15.0
    wakers: dict[JobKey, asyncio.Event] = field(default_factory=dict)
    # When each job was last woken by an event (wake-to-start latency is measured from it).
    woken_at: dict[JobKey, float] = field(default_factory=dict)
    finished: set[JobKey] = field(default_factory=set)
    # Jobs waiting for a free pool, by shape, oldest first (dicts keep insertion order).
    waiting: dict[JobKey, Shape] = field(default_factory=dict)
    # The attempt and time of the heartbeat that last woke each job.
    # Per job: the attempt of the last beat that woke it, when, and the failure reports it had.
    heartbeats: dict[JobKey, tuple[int | None, dt.datetime, frozenset[tuple[int, int, int]]]] = (
        field(default_factory=dict)
    )

    def waker(self, key: JobKey) -> asyncio.Event:
        return self.wakers.setdefault(key, asyncio.Event())

    def forget(self, key: JobKey) -> None:
        for book in (self.wakers, self.woken_at, self.waiting, self.heartbeats):
            book.pop(key, None)
        self.finished.discard(key)

    def wake(self, key: JobKey, *, at: float) -> bool:
        event = self.wakers.get(key)
        if event is None:
            return False
        if not event.is_set():
            event.set()
            self.woken_at[key] = at
        return True

    def wake_live(self, keys: Iterable[JobKey], *, at: float) -> int:
        """Wake those of `keys` that have not finished; how many were woken."""
        return sum(self.wake(key, at=at) for key in set(keys) if key not in self.finished)

    def settled(self, key: JobKey, *, finished: bool, waiting_for: Shape | None) -> None:
        """Record what the job's last reconcile found: finished, or waiting for a pool."""
        if finished:
            self.finished.add(key)
        else:
            self.finished.discard(key)
        if waiting_for is None:
            self.waiting.pop(key, None)
        else:
            self.waiting.setdefault(key, waiting_for)

    def pool_freed(self, shape: Shape, *, at: float, count: int = 1) -> list[JobKey]:
        """Wake the `count` jobs that have waited longest for a pool of `shape`."""
        chosen = [key for key, wanted in self.waiting.items() if wanted == shape][:count]
        for key in chosen:
            self.wake(key, at=at)
        return chosen

    def heartbeat(self, key: JobKey, beat: Heartbeat, *, now: dt.datetime) -> bool:
        """Whether this heartbeat should wake the job now (see the module's note)."""
        if key in self.finished:
            return False
        last = self.heartbeats.get(key)
        reports = frozenset((s, w, r.attempt) for (s, w), r in beat.failures.items())
        due = (
            last is None
            or last[0] != beat.attempt
            or not reports <= last[2]  # a process just ended: its pod waits for a verdict
            or (now - last[1]).total_seconds() >= self.progress_interval_seconds
        )
        if due:
            self.heartbeats[key] = (beat.attempt, now, reports)
        return due
