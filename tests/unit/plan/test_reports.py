"""The statuses a reconcile reports when it cannot plan are built in the planner's wing."""

from __future__ import annotations

from tests.unit.builders import at

from tpujob.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    FieldError,
    Phase,
    TPUTrainingJobStatus,
)
from tpujob.api.reasons import ConditionReason, EventReason
from tpujob.plan import reports

EMPTY = TPUTrainingJobStatus()


def test_refused_pods_are_said_once_per_refusal() -> None:
    first = reports.pods_refused(EMPTY, "exceeded quota: tpu", now=at(0))
    assert first is not None
    status, event = first
    refused = status.condition(ConditionType.PODS_REFUSED)
    assert refused is not None
    assert (refused.status, refused.reason) == (ConditionStatus.TRUE, "FailedCreate")
    assert (event.reason, event.message) == (EventReason.FAILED_CREATE, "exceeded quota: tpu")
    assert reports.pods_refused(status, "exceeded quota: tpu", now=at(9)) is None
    assert reports.pods_refused(status, "forbidden: hostPath", now=at(9)) is not None


def test_an_invalid_spec_names_every_field_and_holds_the_job_pending() -> None:
    errors = [FieldError("spec.tpu.topology", "not a v4 topology"), FieldError("spec.x", "no")]
    status = reports.invalid_spec(EMPTY, errors, now=at(0))
    assert status is not None
    said = status.condition(ConditionType.SPEC_VALID)
    assert said is not None and said.reason == ConditionReason.INVALID_SPEC
    assert said.message == "spec.tpu.topology: not a v4 topology; spec.x: no"
    assert status.phase is Phase.PENDING
    assert reports.invalid_spec(status, errors, now=at(5)) is None


def test_an_invalid_spec_on_a_finished_job_does_not_turn_it_back_to_pending() -> None:
    done = EMPTY.model_copy(update={"phase": Phase.SUCCEEDED})
    status = reports.invalid_spec(done, [FieldError("spec.x", "no")], now=at(0))
    assert status is not None and status.phase is Phase.SUCCEEDED


def test_a_slow_plan_names_the_users_patterns() -> None:
    status = reports.planning_slow(
        EMPTY, budget_seconds=5, retry_seconds=60, patterns=["(a+)+$"], now=at(0)
    )
    said = status.condition(ConditionType.PLANNING_SLOW)
    assert said is not None and said.status == ConditionStatus.TRUE
    assert "longer than 5s" in (said.message or "")
    assert "'(a+)+$'" in (said.message or "")


def test_only_an_unfinished_job_waiting_for_a_pool_waits_for_one() -> None:
    waiting = EMPTY.with_condition(
        Condition(
            type=ConditionType.RUNNING,
            status=ConditionStatus.FALSE,
            reason=ConditionReason.WAITING_FOR_POOL,
            last_transition_time=at(0),
        )
    )
    assert reports.waits_for_pool(waiting)
    assert not reports.waits_for_pool(waiting.model_copy(update={"phase": Phase.FAILED}))
    assert not reports.waits_for_pool(EMPTY)
