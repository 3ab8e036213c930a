"""The goodput breakdown kept in the status: each attempt's facts, recorded as it goes and when
it ends, and the breakdown (`tpujob.plan.goodput_breakdown`) recomputed from them at every
reconcile.

Pure. Times in the records are seconds since the job's start, so the facts stay small and the
breakdown needs no clock but the `now` passed in. The newest `ATTEMPT_HISTORY_LIMIT` ended
attempts are kept; an older attempt's time counts as downtime (said here, since a job that
restarted that often has a bigger problem than its accounting).
"""

from __future__ import annotations

from datetime import datetime

from tpujob.api import GoodputBreakdown, TPUTrainingJobStatus
from tpujob.api.attempt import ATTEMPT_HISTORY_LIMIT, AttemptRecord, AttemptStatus
from tpujob.observed.training import parse_health
from tpujob.observed.views import Heartbeat
from tpujob.plan.goodput_breakdown import AttemptFacts, GoodputCategory, goodput_breakdown


def _since(start: datetime, when: datetime | None) -> float | None:
    return None if when is None else max(0.0, (when - start).total_seconds())


def _input_bound(beat: Heartbeat | None, attempt: int) -> float | None:
    if beat is None or beat.attempt != attempt:
        return None
    report = parse_health(beat.annotations)
    return report.input_bound_fraction if report is not None else None


def _own(beat: Heartbeat | None, attempt: int) -> Heartbeat | None:
    return beat if beat is not None and beat.attempt == attempt else None


def ended_attempt(
    status: TPUTrainingJobStatus, beat: Heartbeat | None, *, now: datetime, failed: bool
) -> tuple[AttemptRecord, ...]:
    """The history with the current attempt appended as ended `now` (unchanged when it never
    launched: an attempt whose pods were never created took no time of its own)."""
    start, current = status.start_time, status.current_attempt
    launched = _since(start, current.launched_time) if start else None
    if start is None or launched is None or status.attempt < 1:
        return status.attempt_history
    own = _own(beat, status.attempt)
    record = AttemptRecord(
        attempt=status.attempt,
        launched=launched,
        first_heartbeat=_since(start, current.first_heartbeat_time),
        first_step=current.resumed_step,
        restored_step=current.restored_step,
        ended=max(launched, _since(start, now) or 0.0),
        failed=failed,
        last_step=own.step if own else None,
        steps_per_second=own.steps_per_second if own else None,
        input_bound_fraction=_input_bound(beat, status.attempt),
        checkpoint_step=status.checkpoint_step,
        slices=current.slices,
    )
    kept = [r for r in status.attempt_history if r.attempt != status.attempt]
    return (*kept, record)[-ATTEMPT_HISTORY_LIMIT:]


def _facts(record: AttemptRecord) -> AttemptFacts:
    return AttemptFacts(
        launched_at=record.launched,
        first_heartbeat_at=record.first_heartbeat,
        first_step=record.first_step,
        restored_step=record.restored_step,
        ended_at=record.ended,
        failed=record.failed,
        last_step=record.last_step,
        steps_per_second=record.steps_per_second,
        input_bound_fraction=record.input_bound_fraction,
        checkpoint_step=record.checkpoint_step,
    )


def _current_facts(
    status: TPUTrainingJobStatus, beat: Heartbeat | None, start: datetime
) -> AttemptFacts | None:
    current: AttemptStatus = status.current_attempt
    launched = _since(start, current.launched_time)
    ended = any(r.attempt == status.attempt for r in status.attempt_history)
    if launched is None or ended:
        return None
    own = _own(beat, status.attempt)
    return AttemptFacts(
        launched_at=launched,
        first_heartbeat_at=_since(start, current.first_heartbeat_time),
        first_step=current.resumed_step,
        restored_step=current.restored_step,
        last_step=own.step if own else None,
        steps_per_second=own.steps_per_second if own else None,
        input_bound_fraction=_input_bound(beat, status.attempt),
    )


def breakdown(
    status: TPUTrainingJobStatus, beat: Heartbeat | None, *, now: datetime
) -> GoodputBreakdown | None:
    """The job's wall time by category, up to `now` or its completion."""
    start = status.start_time
    if start is None:
        return None
    end = status.completion_time or now
    wall = max(0.0, (end - start).total_seconds())
    facts = [_facts(r) for r in status.attempt_history]
    if (current := _current_facts(status, beat, start)) is not None:
        facts.append(current)
    result = goodput_breakdown(wall_seconds=wall, attempts=facts)
    seconds = {c: round(result.seconds(c), 3) for c in GoodputCategory}
    # Time waiting for a Kueue admission after the start (a preemption) is inside no attempt:
    # the breakdown counted it as downtime, where it is told apart.
    queued = min(seconds[GoodputCategory.DOWNTIME], _queued_seconds(status, end))
    seconds[GoodputCategory.DOWNTIME] = round(seconds[GoodputCategory.DOWNTIME] - queued, 3)
    return GoodputBreakdown(
        wall_seconds=round(result.wall_ms / 1000, 3),
        productive=seconds[GoodputCategory.PRODUCTIVE],
        startup=seconds[GoodputCategory.STARTUP],
        restore=seconds[GoodputCategory.RESTORE],
        redone=seconds[GoodputCategory.REDONE],
        data_wait=seconds[GoodputCategory.DATA_WAIT],
        downtime=seconds[GoodputCategory.DOWNTIME],
        other=seconds[GoodputCategory.OTHER],
        queued=round(queued, 3),
        degraded=round(_degraded_seconds(status, end), 3),
    )


def _degraded_seconds(status: TPUTrainingJobStatus, end: datetime) -> float:
    """Seconds the job's attempts ran on fewer slices than it asks for, to `end`."""
    ended = sum(r.ended - r.launched for r in status.attempt_history if r.slices is not None)
    current = status.current_attempt
    if current.slices is None or current.launched_time is None:
        return ended
    recorded = any(r.attempt == status.attempt for r in status.attempt_history)
    return ended + (0.0 if recorded else max(0.0, (end - current.launched_time).total_seconds()))


def _queued_seconds(status: TPUTrainingJobStatus, end: datetime) -> float:
    """Seconds since the job's start spent waiting for a Kueue admission, to `end`."""
    queue, start = status.queue, status.start_time
    if queue is None or start is None:
        return 0.0
    waiting = 0.0
    if queue.waiting_since is not None:
        waiting = max(0.0, (end - max(queue.waiting_since, start)).total_seconds())
    return queue.queued_seconds + waiting


def goodput_of(parts: GoodputBreakdown | None) -> float | None:
    if parts is None or parts.wall_seconds <= 0:
        return None
    return round(min(1.0, parts.productive / parts.wall_seconds), 4)
