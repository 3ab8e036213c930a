"""The status the operator writes: round trips, lenient reads, bounded timeline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tpujob.api import (
    Condition,
    ConditionStatus,
    FailureClass,
    LastFailure,
    Phase,
    Restarts,
    TimelineEvent,
    TPUTrainingJobStatus,
    parse_status,
    status_patch,
)
from tpujob.api.constants import TIMELINE_LIMIT

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_status_patch_is_camel_case_without_unset_fields() -> None:
    status = TPUTrainingJobStatus(
        phase=Phase.RECOVERING,
        attempt=2,
        checkpoint_step=300,
        last_failure=LastFailure(
            failure_class=FailureClass.HARD, code="DEVICE_COUNT_MISMATCH", node="n1", time=T0
        ),
    )
    patch = status_patch(status)
    assert patch["phase"] == "Recovering"
    assert patch["checkpointStep"] == 300
    assert patch["lastFailure"] == {
        "class": "hard",
        "code": "DEVICE_COUNT_MISMATCH",
        "chain": [],
        "evidence": [],
        "node": "n1",
        "time": "2026-01-02T03:04:05Z",
    }
    assert "progress" not in patch
    assert "goodput" not in patch


def test_status_round_trips_through_its_patch() -> None:
    status = TPUTrainingJobStatus(
        phase=Phase.RUNNING, restarts=Restarts(soft=2, hard=1), goodput=0.93
    ).with_event(TimelineEvent(time=T0, kind="Resumed", message="from step 300"))
    assert parse_status(status_patch(status)) == status


def test_unknown_status_fields_written_by_another_version_are_kept() -> None:
    status = parse_status({"phase": "Running", "futureField": {"a": 1}})
    assert status.phase is Phase.RUNNING
    assert status_patch(status)["futureField"] == {"a": 1}


def test_missing_status_reads_as_empty() -> None:
    assert parse_status(None) == TPUTrainingJobStatus()


def test_restart_total_is_the_sum_of_the_classes() -> None:
    restarts = Restarts().incremented(FailureClass.SOFT).incremented(FailureClass.HARD)
    restarts = restarts.incremented(FailureClass.FATAL)
    assert (restarts.soft, restarts.hard, restarts.total) == (1, 1, 2)
    assert parse_status({"restarts": {"soft": 4, "medium": 1}}).restarts.total == 5


def test_timeline_keeps_only_the_newest_events() -> None:
    status = TPUTrainingJobStatus()
    for i in range(TIMELINE_LIMIT + 7):
        status = status.with_event(
            TimelineEvent(time=T0 + timedelta(seconds=i), kind="Failed", message=str(i))
        )
    assert len(status.timeline) == TIMELINE_LIMIT
    assert status.timeline[0].message == "7"
    assert status.timeline[-1].message == str(TIMELINE_LIMIT + 6)


def test_condition_keeps_its_transition_time_while_its_status_is_unchanged() -> None:
    later = T0 + timedelta(minutes=5)
    status = TPUTrainingJobStatus().with_condition(
        Condition(type="Running", status=ConditionStatus.TRUE, last_transition_time=T0)
    )
    same = status.with_condition(
        Condition(type="Running", status=ConditionStatus.TRUE, last_transition_time=later)
    )
    flipped = same.with_condition(
        Condition(type="Running", status=ConditionStatus.FALSE, last_transition_time=later)
    )
    assert [c.last_transition_time for c in same.conditions] == [T0]
    assert [c.last_transition_time for c in flipped.conditions] == [later]
