"""The goodput breakdown in the status: attempts recorded as they end, the parts summing to the
wall time, and lost steps counted as re-done."""

from __future__ import annotations

import datetime as dt

import pytest

from tpujob.api import TPUTrainingJobStatus
from tpujob.api.attempt import AttemptStatus
from tpujob.observed.views import Heartbeat
from tpujob.plan.goodput import breakdown, ended_attempt, goodput_of

T0 = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)


def t(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def beat(attempt: int, step: int, rate: float = 1.0) -> Heartbeat:
    return Heartbeat(renewed=None, step=step, attempt=attempt, steps_per_second=rate)


def a_job_that_failed_once_and_finished() -> TPUTrainingJobStatus:
    """Attempt 1: launched at 0, trains from 10 s (step 0) at 1 step/s, fails at 60 s having
    reached step 50 with step 40 committed. Attempt 2: launched at 70 s from step 40, first
    heartbeat at 80 s (step 41), finishes at 140 s at step 100."""
    status = TPUTrainingJobStatus(
        start_time=t(0),
        attempt=1,
        current_attempt=AttemptStatus(
            launched_time=t(0), first_heartbeat_time=t(10), resumed_step=0, restored_step=None
        ),
        checkpoint_step=40,
    )
    status = status.model_copy(
        update={"attempt_history": ended_attempt(status, beat(1, 50), now=t(60), failed=True)}
    )
    status = status.model_copy(
        update={
            "attempt": 2,
            "current_attempt": AttemptStatus(
                launched_time=t(70), first_heartbeat_time=t(80), resumed_step=41, restored_step=40
            ),
        }
    )
    status = status.model_copy(
        update={
            "attempt_history": ended_attempt(status, beat(2, 100), now=t(140), failed=False),
            "completion_time": t(140),
        }
    )
    return status


def test_the_parts_sum_to_the_wall_time_and_lost_steps_are_redone() -> None:
    status = a_job_that_failed_once_and_finished()
    parts = breakdown(status, None, now=t(500))
    assert parts is not None
    assert parts.wall_seconds == 140  # to the completion, not to `now`
    total = (
        parts.productive
        + parts.startup
        + parts.restore
        + parts.redone
        + parts.data_wait
        + parts.downtime
        + parts.other
    )
    assert total == pytest.approx(parts.wall_seconds, abs=0.01)
    assert parts.downtime == pytest.approx(10)  # 60 -> 70: between the attempts
    assert parts.redone == pytest.approx(10)  # steps 40..50 were trained twice
    assert parts.productive == pytest.approx(100, abs=1)  # 100 steps kept at 1 step/s
    assert goodput_of(parts) == pytest.approx(100 / 140, abs=0.01)


def test_an_attempt_is_recorded_once_and_only_when_it_launched() -> None:
    status = a_job_that_failed_once_and_finished()
    again = ended_attempt(status, beat(2, 100), now=t(150), failed=False)
    assert [r.attempt for r in again] == [1, 2]
    never = TPUTrainingJobStatus(start_time=t(0), attempt=1)
    assert ended_attempt(never, None, now=t(5), failed=True) == ()


def test_a_running_attempt_counts_up_to_now() -> None:
    status = TPUTrainingJobStatus(
        start_time=t(0),
        attempt=1,
        current_attempt=AttemptStatus(
            launched_time=t(0), first_heartbeat_time=t(20), resumed_step=0
        ),
    )
    parts = breakdown(status, beat(1, 30), now=t(50))
    assert parts is not None and parts.wall_seconds == 50
    assert parts.startup == pytest.approx(20)
    assert parts.productive == pytest.approx(30)


def test_a_heartbeat_of_another_attempt_is_not_this_ones_progress() -> None:
    status = TPUTrainingJobStatus(
        start_time=t(0), attempt=2, current_attempt=AttemptStatus(launched_time=t(10))
    )
    parts = breakdown(status, beat(1, 500), now=t(20))
    assert parts is not None and parts.productive == 0
