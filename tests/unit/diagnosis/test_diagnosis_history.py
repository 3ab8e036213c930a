"""History guards: deterministic repeats become fatal; unknown failures are bounded."""

from __future__ import annotations

import pytest

from tpujob.diagnosis import (
    FailureClass,
    FailureCode,
    JobFacts,
    NodeFacts,
    PastFailure,
    WorkerFacts,
    diagnose_job,
)

COLLECTIVE = "XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: step-sync"


def job(log: str, *, step: int | None, exit_code: int = 1, node: str = "") -> JobFacts:
    worker = WorkerFacts(
        worker_index=0, exit_code=exit_code, log_tail=log, step=step, node_name=node
    )
    return JobFacts(workers=(worker,))


def previous(facts: JobFacts) -> PastFailure:
    first = diagnose_job(facts)
    return PastFailure(signature=first.signature, code=first.code, step=first.step)


def test_same_signature_at_same_step_twice_is_fatal_with_reason() -> None:
    facts = job(COLLECTIVE, step=1200)
    diagnosis = diagnose_job(facts, history=[previous(facts)])
    assert (diagnosis.failure_class, diagnosis.code) == (
        FailureClass.FATAL,
        FailureCode.DETERMINISTIC_REPEAT,
    )
    assert "twice in a row at step 1200" in diagnosis.summary


@pytest.mark.parametrize(
    ("first_step", "second_step", "first_log"),
    [(1200, 1300, COLLECTIVE), (None, None, COLLECTIVE), (1200, 1200, "Connection reset by peer")],
    ids=["different-step", "unknown-step", "different-signature"],
)
def test_repeat_guard_needs_same_signature_and_known_same_step(
    first_step: int | None, second_step: int | None, first_log: str
) -> None:
    history = [previous(job(first_log, step=first_step))]
    diagnosis = diagnose_job(job(COLLECTIVE, step=second_step), history=history)
    assert diagnosis.code is FailureCode.COLLECTIVE_TIMEOUT


def test_numbers_in_the_message_do_not_change_the_signature() -> None:
    first = diagnose_job(job("Barrier timed out. Id: sync-17 after 600s", step=5))
    second = diagnose_job(job("Barrier timed out. Id: sync-18 after 601s", step=5))
    assert first.signature == second.signature


def test_preemption_at_the_same_step_is_not_escalated() -> None:
    facts = job("the node was preempted", step=50)
    diagnosis = diagnose_job(facts, history=[previous(facts)])
    assert diagnosis.code is FailureCode.PREEMPTED


@pytest.mark.parametrize(
    ("unknown_before", "limit", "expected"),
    [
        (1, 3, FailureCode.UNKNOWN),
        (3, 3, FailureCode.UNKNOWN_RETRY_LIMIT),
        (1, 1, FailureCode.UNKNOWN_RETRY_LIMIT),
    ],
    ids=["under-limit", "at-limit", "limit-one"],
)
def test_unknown_failures_are_retried_a_bounded_number_of_times(
    unknown_before: int, limit: int, expected: FailureCode
) -> None:
    history = [
        PastFailure(signature=f"UNKNOWN:{i}", code=FailureCode.UNKNOWN, step=i)
        for i in range(unknown_before)
    ]
    diagnosis = diagnose_job(job("weird", step=999), history=history, unknown_retry_limit=limit)
    assert diagnosis.code is expected
    assert diagnosis.failure_class.retrying is (expected is FailureCode.UNKNOWN)


def test_device_busy_again_on_the_same_node_becomes_hard() -> None:
    busy = "open(/dev/vfio/0): Device or resource busy"
    history = [PastFailure(signature="x", code=FailureCode.DEVICE_BUSY, step=0, node="n7")]
    same = diagnose_job(job(busy, step=None, node="n7"), history=history)
    other = diagnose_job(job(busy, step=None, node="n8"), history=history)
    assert same.failure_class is FailureClass.HARD
    assert other.failure_class is FailureClass.SOFT


def test_node_name_from_node_facts_counts_for_device_busy() -> None:
    worker = WorkerFacts(
        worker_index=0, exit_code=13, node=NodeFacts(name="n7"), log_tail="Device or resource busy"
    )
    history = [PastFailure(signature="x", code=FailureCode.DEVICE_BUSY, node="n7")]
    diagnosis = diagnose_job(JobFacts(workers=(worker,)), history=history)
    assert diagnosis.failure_class is FailureClass.HARD


def test_a_non_finite_loss_at_the_same_step_again_keeps_its_own_rollback_budget() -> None:
    # The rollback resumes before the NaN and meets the same step again; how many times that
    # may happen is spec.recovery.maxNanRollbacks, not the repeat guard.
    facts = job("FloatingPointError: non-finite loss (nan) at step 120", step=120, exit_code=24)
    first = diagnose_job(facts)
    assert first.code is FailureCode.NAN_LOSS
    diagnosis = diagnose_job(facts, history=[previous(facts)])
    assert diagnosis.code is FailureCode.NAN_LOSS
