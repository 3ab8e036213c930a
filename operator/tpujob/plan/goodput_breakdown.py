"""Goodput breakdown: where a job's wall time went, by category, from its attempts' facts.

Pure: no I/O, no clock. The categories follow the published ML goodput conventions (Google's
ml-goodput-measurement): goodput is the time spent on training steps that were kept; badput is
the rest, by cause. Times are seconds since the job started; `wall_seconds` is now (or the
completion time) minus the start. Each attempt covers [launched, ended) (ended: the failure or
success seen, else the next launch, else the end of the wall time), and inside it:

* **start-up and compile**: launch to the moment training began, estimated as the first
  heartbeat minus the time its steps took (first step - restored step, at the attempt's step
  time); pod scheduling, image pull, device initialisation, compilation;
* **checkpoint restore**: `restore_seconds` when the trainer measured it, taken out of the
  start-up (without it the restore counts as start-up);
* **re-done (lost) steps**: steps of this attempt past the step the next attempt restored (a
  restart or a rollback), and, for a failed attempt, its time after the last reported step up
  to the failure (unreported steps and detection);
* **waiting for data**: the input-bound fraction of the time of the kept steps;
* **productive steps**: the rest of the time of the kept steps;
* **downtime between attempts**: wall time inside no attempt (before the first launch, and
  from a failure to the next launch: diagnosis, backoff, rescheduling);
* **other**: the remainder, so the categories sum to the wall time exactly (a running or
  finished attempt's time since its last heartbeat; a final save and exit).

Checkpoint saves are inside the trainer's step time and count with the steps. Facts come from
the status timeline and the trainer's heartbeat: every number is range-checked, and a bad one
is absent (an attempt with a bad launch time is left out; its time counts as downtime).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tpujob.observed.training import MAX_STEP

MAX_STEPS_PER_SECOND = 1e6


class GoodputCategory(StrEnum):
    """Where wall time went; `PRODUCTIVE` is goodput, the others are badput."""

    PRODUCTIVE = "productive"
    STARTUP = "startup"
    RESTORE = "restore"
    REDONE = "redone"
    DATA_WAIT = "dataWait"
    DOWNTIME = "downtime"
    OTHER = "other"


@dataclass(frozen=True)
class AttemptFacts:
    """What the planner knows of one attempt; times are seconds since the job's start."""

    launched_at: float
    first_heartbeat_at: float | None = None
    first_step: int | None = None  # the step of the first heartbeat
    restored_step: int | None = None  # the checkpoint it resumed from; None: from step 0
    ended_at: float | None = None  # failure or success seen; None: still running
    failed: bool = False
    last_step: int | None = None  # the last step it reported
    steps_per_second: float | None = None
    input_bound_fraction: float | None = None
    checkpoint_step: int | None = None  # last committed checkpoint when it ended
    restore_seconds: float | None = None  # measured by the trainer, when it reports it


@dataclass(frozen=True)
class Breakdown:
    """Wall time by category, in whole milliseconds that sum to `wall_ms` exactly."""

    wall_ms: int
    parts: Mapping[GoodputCategory, int] = field(default_factory=dict)

    def seconds(self, category: GoodputCategory) -> float:
        return self.parts.get(category, 0) / 1000

    @property
    def goodput(self) -> float | None:
        """Productive time over wall time; None before any wall time."""
        return (
            self.parts.get(GoodputCategory.PRODUCTIVE, 0) / self.wall_ms
            if self.wall_ms > 0
            else None
        )


def _time(value: float | None, low: float, high: float) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return min(max(value, low), high)


def _step(value: int | None) -> int | None:
    return value if isinstance(value, int) and 0 <= value <= MAX_STEP else None


def _rate(value: float | None, high: float) -> float | None:
    ok = value is not None and math.isfinite(value) and 0 < value <= high
    return value if ok else None


@dataclass(frozen=True)
class _Span:
    facts: AttemptFacts
    start: float
    end: float
    next_restored: int | None  # None: no later attempt has restored yet


def _spans(wall: float, attempts: Sequence[AttemptFacts]) -> list[_Span]:
    """Attempts as disjoint spans inside [0, wall], in launch order."""
    valid = sorted(
        (
            a
            for a in attempts
            if _time(a.launched_at, 0, wall) is not None and a.launched_at <= wall
        ),
        key=lambda a: a.launched_at,
    )
    spans, floor = [], 0.0
    for i, facts in enumerate(valid):
        start = max(floor, facts.launched_at)
        following = valid[i + 1] if i + 1 < len(valid) else None
        ceiling = wall if following is None else max(start, following.launched_at)
        end = _time(facts.ended_at, start, ceiling)
        following_restored = None
        if following is not None:
            # Restoring nothing is restarting from step 0, once the attempt has trained.
            trained = _step(following.first_step) is not None
            following_restored = (
                _step(following.restored_step)
                if following.restored_step is not None
                else (0 if trained else None)
            )
        spans.append(_Span(facts, start, ceiling if end is None else end, following_restored))
        floor = spans[-1].end
    return spans


def _attempt(span: _Span) -> dict[GoodputCategory, float]:
    """The categories of one attempt's span; they sum to at most its length."""
    f, length = span.facts, span.end - span.start
    beat = _time(f.first_heartbeat_at, span.start, span.end)
    first, last = _step(f.first_step), _step(f.last_step)
    if beat is None or first is None:
        return {GoodputCategory.STARTUP: length}  # it never reported training
    restored = min(_step(f.restored_step) or 0, first)
    last = max(first, last if last is not None else first)
    rate = _rate(f.steps_per_second, MAX_STEPS_PER_SECOND)
    # Without a reported rate, the steps between the first heartbeat and the end set it.
    per_step = 1 / rate if rate else ((span.end - beat) / (last - first) if last > first else 0.0)
    began = max(span.start, beat - (first - restored) * per_step)
    step_time = min(span.end - began, (last - restored) * per_step)
    # Steps past what the next attempt restored are lost; before it restores, a failed
    # attempt's own last checkpoint tells; with neither, no loss is claimed.
    checkpoint = _step(f.checkpoint_step) if f.failed else None
    keep_to = min(
        last,
        span.next_restored
        if span.next_restored is not None
        else checkpoint
        if checkpoint is not None
        else last,
    )
    kept_fraction = (max(0, keep_to - restored) / (last - restored)) if last > restored else 1.0
    kept = step_time * kept_fraction
    wait_fraction = _time(f.input_bound_fraction, 0.0, 1.0) or 0.0
    restore = _time(f.restore_seconds, 0.0, began - span.start) or 0.0
    tail = span.end - began - step_time  # after the last reported step
    return {
        GoodputCategory.STARTUP: began - span.start - restore,
        GoodputCategory.RESTORE: restore,
        GoodputCategory.PRODUCTIVE: kept * (1 - wait_fraction),
        GoodputCategory.DATA_WAIT: kept * wait_fraction,
        GoodputCategory.REDONE: step_time - kept + (tail if f.failed else 0.0),
    }


def goodput_breakdown(*, wall_seconds: float, attempts: Sequence[AttemptFacts]) -> Breakdown:
    """The job's wall time by category (see the module docstring for each category)."""
    if not math.isfinite(wall_seconds) or wall_seconds <= 0:
        return Breakdown(0, {c: 0 for c in GoodputCategory})
    spans = _spans(wall_seconds, attempts)
    totals = dict.fromkeys(GoodputCategory, 0.0)
    totals[GoodputCategory.DOWNTIME] = wall_seconds - sum(s.end - s.start for s in spans)
    for span in spans:
        for category, seconds in _attempt(span).items():
            totals[category] += max(0.0, seconds)
    # Whole milliseconds by rounding running totals, not each part: every part stays >= 0,
    # and whatever rounding leaves over lands in `other`, so the sum is exact.
    wall_ms = round(wall_seconds * 1000)
    parts: dict[GoodputCategory, int] = {}
    running, done = 0.0, 0
    for category in GoodputCategory:
        if category is GoodputCategory.OTHER:
            continue
        running += totals[category]
        edge = min(wall_ms, max(done, round(running * 1000)))
        parts[category], done = edge - done, edge
    parts[GoodputCategory.OTHER] = wall_ms - done
    return Breakdown(wall_ms, parts)
