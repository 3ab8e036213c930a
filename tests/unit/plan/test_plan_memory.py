"""The job's memory in the planner: where a failure recurs decides its grade and its blame."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import (
    at,
    cluster,
    iso,
    job_body,
    lease,
    observed,
    pod,
    running_status,
    trainer_message,
)

from tpujob import diagnosis as dx
from tpujob.api import Phase, contract, labels
from tpujob.diagnosis.unknown import weigh_model_guess
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan, PlannerSettings

RESTORE_FAILED = trainer_message(
    contract.ExitCode.CHECKPOINT_RESTORE_FAILED, "could not read step 40: EIO", step=None
)


def fail_worker1(
    job: dict[str, Any],
    attempt: int,
    node: str,
    message: str,
    now: float,
    *,
    settings: PlannerSettings | None = None,
) -> Plan:
    pool = node.rsplit("-", 1)[0]
    pods = [
        pod(job, attempt, 0, 0, node_name=f"{pool}-w0"),
        pod(job, attempt, 0, 1, phase="Failed", exit_code=1, message=message, node_name=node),
    ]
    return plan(observed(job, pods), now=at(now), settings=settings or PlannerSettings())


def next_job(result: Plan, launched: str) -> dict[str, Any]:
    status = result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    status["currentAttempt"]["launchedTime"] = launched
    return job_body(status=status)


@pytest.mark.parametrize(
    ("second_node", "phase", "blamed", "evidence"),
    [
        ("pool-0-w1", Phase.RECOVERING, ["pool-0-w1"], "seen 2 times in a row on node pool-0-w1"),
        ("pool-1-w1", Phase.FAILED, [], "seen 2 times on 2 nodes"),
    ],
    ids=["same-node-blames-the-node", "other-nodes-is-the-program"],
)
def test_a_failure_that_recurs_is_graded_by_where_it_recurs(
    second_node: str, phase: Phase, blamed: list[str], evidence: str
) -> None:
    first_job = job_body(status=running_status())
    first = fail_worker1(first_job, 1, "pool-0-w1", RESTORE_FAILED, now=20)
    assert first.status.phase is Phase.RECOVERING
    assert first.status.failed_nodes == ()
    second = fail_worker1(
        next_job(first, "2026-01-01T12:00:30Z"), 2, second_node, RESTORE_FAILED, now=60
    )
    assert second.status.phase is phase
    assert [n.name for n in second.status.failed_nodes] == blamed
    # The job's own history alone: this job avoids the node, no other job is kept off it.
    assert all(n.job_only for n in second.status.failed_nodes)
    assert second.mark_nodes == ()
    assert second.status.last_failure is not None
    assert any(evidence in e for e in second.status.last_failure.evidence)
    assert evidence in second.status.last_failure.summary
    told = " ".join(e.message for e in second.events)
    assert evidence in told


def test_a_trainers_own_hard_grade_moves_the_slice_but_blames_no_node() -> None:
    job = job_body(status=running_status())
    message = trainer_message(
        contract.ExitCode.DEVICE_COUNT_MISMATCH, "found 2 of 4 chips", step=None
    )
    result = fail_worker1(job, 1, "pool-0-w1", message, now=20)
    assert result.status.restarts.hard == 1
    assert result.status.failed_nodes == ()
    assert result.mark_nodes == ()
    assert result.status.current_attempt.placement[0].node_pool != "pool-0"


def model_guess(cls: dx.FailureClass, confidence: dx.Confidence) -> dx.Diagnosis:
    return dx.Diagnosis(
        failure_class=cls,
        code=dx.FailureCode.UNKNOWN,
        summary="odd",
        confidence=confidence,
        rule="text-model",
        probability=0.5,
    )


@pytest.mark.parametrize(
    ("cls", "confidence", "after"),
    [
        (dx.FailureClass.FATAL, dx.Confidence.LOW, dx.FailureClass.MEDIUM),
        (dx.FailureClass.HARD, dx.Confidence.LOW, dx.FailureClass.MEDIUM),
        (dx.FailureClass.FATAL, dx.Confidence.MEDIUM, dx.FailureClass.FATAL),
        (dx.FailureClass.SOFT, dx.Confidence.LOW, dx.FailureClass.SOFT),
    ],
    ids=str,
)
def test_a_weak_model_guess_never_stops_the_job_or_moves_it(
    cls: dx.FailureClass, confidence: dx.Confidence, after: dx.FailureClass
) -> None:
    assert weigh_model_guess(model_guess(cls, confidence)).failure_class is after


def crash_on(
    job: dict[str, Any],
    attempt: int,
    node: str,
    *,
    crashed: int,
    peer_failed: bool,
    now: float,
    beat: dict[str, Any] | None = None,
) -> Plan:
    """Worker `crashed` of slice 0 dead of SIGSEGV on `node`; the other worker on the pool's
    other node, failed after it (its collective broke) or still running."""
    pool, host = node.rsplit("-", 1)
    peer = pod(
        job,
        attempt,
        0,
        1 - crashed,
        node_name=f"{pool}-{'w0' if host == 'w1' else 'w1'}",
        **({"phase": "Failed", "exit_code": 30, "finished": now - 1} if peer_failed else {}),
    )
    pods = [
        pod(
            job,
            attempt,
            0,
            crashed,
            phase="Failed",
            exit_code=139,
            node_name=node,
            finished=now - 2,
        ),
        peer,
    ]
    return plan(observed(job, pods, heartbeat=beat), now=at(now))


def test_a_crash_that_recurs_on_one_node_blames_it_whichever_worker_it_hits() -> None:
    # A soft restart keeps the slice's pool, not each worker's node: the node that failed
    # worker 1 in attempt 1 may host worker 0 in attempt 2. Neither that nor whether the peer
    # failed before the operator looked makes it another failure. Attempt 1 trained before it
    # failed (from step 1 to 25), which is no progress between the two failures; attempt 2
    # crashes as it starts.
    first_job = job_body(
        status=running_status(
            currentAttempt={
                "placement": [{"slice": 0, "nodePool": "pool-0"}],
                "launchedTime": iso(at(0)),
                "resumedStep": 1,
            }
        )
    )
    first = crash_on(
        first_job,
        1,
        "pool-0-w1",
        crashed=1,
        peer_failed=True,
        now=20,
        beat=lease(renewed=19, step=25),
    )
    assert first.status.failure_history[-1].progressed
    assert first.status.restarts.medium == 1
    assert first.status.last_failure is not None
    assert "other worker" in first.status.last_failure.summary
    second = crash_on(
        next_job(first, "2026-01-01T12:00:30Z"),
        2,
        "pool-0-w1",
        crashed=0,
        peer_failed=False,
        now=60,
        beat=lease(renewed=19, step=25),
    )
    assert second.status.phase is Phase.RECOVERING
    assert second.status.restarts.hard == 1
    assert [n.name for n in second.status.failed_nodes] == ["pool-0-w1"]
    assert second.status.current_attempt.placement[0].node_pool != "pool-0"
    assert second.mark_nodes == ()  # no taint from one job's own failures


def test_a_job_that_fails_the_same_way_on_one_node_cannot_get_it_marked_even_later() -> None:
    # The journal re-derives marks from status.failedNodes on every reconcile: a node only the
    # job's own history blames must stay unmarked there too.
    first_job = job_body(status=running_status())
    first = fail_worker1(first_job, 1, "pool-0-w1", RESTORE_FAILED, now=20)
    second = fail_worker1(
        next_job(first, "2026-01-01T12:00:30Z"), 2, "pool-0-w1", RESTORE_FAILED, now=60
    )
    later = plan(observed(next_job(second, "2026-01-01T12:01:30Z")), now=at(95))
    assert [n.name for n in later.status.failed_nodes] == ["pool-0-w1"]
    assert later.mark_nodes == ()
    assert "avoided by this job" in " ".join(e.message for e in second.events)
    assert second.status.last_failure is not None
    assert any(
        "seen 2 times in a row on node pool-0-w1" in e for e in second.status.last_failure.evidence
    )


def test_a_node_the_job_alone_blamed_is_marked_once_it_is_lost() -> None:
    first_job = job_body(status=running_status())
    first = fail_worker1(first_job, 1, "pool-0-w1", RESTORE_FAILED, now=20)
    second = fail_worker1(
        next_job(first, "2026-01-01T12:00:30Z"), 2, "pool-0-w1", RESTORE_FAILED, now=60
    )
    assert [n.job_only for n in second.status.failed_nodes] == [True]
    # Attempt 3 landed back on that pool after all, and the node is lost under it.
    job = next_job(second, "2026-01-01T12:01:30Z")
    job["status"]["currentAttempt"]["placement"] = [{"slice": 0, "nodePool": "pool-0"}]
    nodes = cluster(3, **{"pool-0-w1": {"ready": "Unknown", "taints": (labels.UNREACHABLE_TAINT,)}})
    lost = plan(
        observed(
            job,
            [pod(job, 3, 0, 0, node_name="pool-0-w0"), pod(job, 3, 0, 1, node_name="pool-0-w1")],
            nodes=nodes,
        ),
        now=at(200),
    )
    assert [(n.name, n.job_only) for n in lost.status.failed_nodes] == [("pool-0-w1", None)]
    assert [m.node for m in lost.mark_nodes] == ["pool-0-w1"]


@pytest.mark.parametrize(
    ("trusted", "marked"),
    [
        (("team",), True),
        (("te*",), True),
        (("*",), True),
        (("other", "team-*"), False),
        ((), False),
    ],
    ids=["named", "pattern", "everyone", "not-this-one", "no-one"],
)
def test_a_trusted_namespaces_repeat_on_one_node_marks_the_node_for_everyone(
    trusted: tuple[str, ...], marked: bool
) -> None:
    settings = PlannerSettings(trusted_namespaces=trusted)
    first = fail_worker1(
        job_body(status=running_status()), 1, "pool-0-w1", RESTORE_FAILED, now=20, settings=settings
    )
    second = fail_worker1(
        next_job(first, "2026-01-01T12:00:30Z"),
        2,
        "pool-0-w1",
        RESTORE_FAILED,
        now=60,
        settings=settings,
    )
    assert second.status.phase is Phase.RECOVERING
    assert second.status.current_attempt.placement[0].node_pool != "pool-0"
    assert [(n.name, n.job_only) for n in second.status.failed_nodes] == [
        ("pool-0-w1", None if marked else True)
    ]
    assert [m.node for m in second.mark_nodes] == (["pool-0-w1"] if marked else [])
