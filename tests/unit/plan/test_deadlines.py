"""When a starting or running job is looked at again with no event: at its deadlines (the
heartbeat's, the start graces) under a long net when nothing about it is in motion, at the
operator's short poll while anything is."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import (
    T0,
    at,
    cluster,
    iso,
    job_body,
    lease,
    observed,
    pod,
    refused,
    running_status,
)

from tpujob.api import Phase
from tpujob.plan.deadlines import PAST_DEADLINE_SECONDS
from tpujob.plan.planner import plan
from tpujob.plan.result import PlannerSettings
from tpujob.plan.starting import NOT_STARTED_GRACE_SECONDS, UNSCHEDULABLE_GRACE_SECONDS

SETTINGS = PlannerSettings(poll_seconds=5.0, steady_poll_seconds=60.0)


def running_job(stall: int = 600, **status: Any) -> dict[str, Any]:
    return job_body(
        status=running_status(**status),
        recovery={"stallTimeoutSeconds": stall, "startupTimeoutSeconds": 300},
    )


def workers(job: dict[str, Any], **worker1: Any) -> list[dict[str, Any]]:
    return [pod(job, 1, 0, 0), pod(job, 1, 0, 1, **worker1)]


@pytest.mark.parametrize(
    ("case", "stall", "beat", "now", "expected"),
    [
        # A stall timeout longer than the net: the net.
        ("long stall timeout", 600, lease(renewed=100, step=40), 110, 60.0),
        # The heartbeat was last renewed at 100 s; with 30 s it is judged at 130 s.
        (
            "stall deadline first",
            30,
            lease(renewed=100, step=40),
            110,
            20.0 + PAST_DEADLINE_SECONDS,
        ),
        # Announced, no step yet: the start-up timeout counts from the workers' start (T0).
        ("start-up deadline", 600, lease(renewed=100), 280, 20.0 + PAST_DEADLINE_SECONDS),
        # Never announced: the Heartbeat condition is decided 120 s after the workers started.
        ("announce deadline", 600, None, 100, 20.0 + PAST_DEADLINE_SECONDS),
        # Never announced and past the grace: nothing but events and the net.
        ("own trainer, decided", 600, None, 300, 60.0),
        # Stall detection off, never announced: the net.
        ("stall detection off", 0, None, 100, 60.0),
    ],
)
def test_a_steadily_running_job_is_looked_at_by_its_next_deadline_under_the_net(
    case: str, stall: int, beat: dict[str, Any] | None, now: float, expected: float
) -> None:
    job = running_job(stall)
    result = plan(observed(job, workers(job), heartbeat=beat), now=at(now), settings=SETTINGS)
    assert result.status.phase is Phase.RUNNING, case
    assert result.diagnosis is None, case
    assert result.requeue_after == pytest.approx(expected), case


def pending(manifest: dict[str, Any]) -> dict[str, Any]:
    manifest["status"]["phase"] = "Pending"
    manifest["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "Creating"}}
    return manifest


def test_a_running_job_with_something_in_motion_keeps_the_short_poll() -> None:
    job = running_job(attempt=2)
    now = pod(job, 2, 0, 0), pod(job, 2, 0, 1)
    # Ready=False for 10 s of the 40 s grace: the grace ends with no event.
    not_ready = cluster(3, **{"pool-0-w1": {"ready": "False", "ready_since": at(100)}})
    cases: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
        "a pod of the last attempt still terminating": (
            [*now, pod(job, 1, 0, 1, deleting=100, node_name="pool-2-w1")],
            None,
        ),
        "a pod of the last attempt not started, deleted now": (
            [*now, pending(pod(job, 1, 0, 0))],
            None,
        ),
        "a node within its not-ready grace": (list(now), not_ready),
    }
    beat = lease(renewed=105, step=40, attempt=2)
    for case, (pods, nodes) in cases.items():
        result = plan(
            observed(job, pods, nodes=nodes, heartbeat=beat), now=at(110), settings=SETTINGS
        )
        assert result.diagnosis is None, case
        assert result.status.phase is Phase.RUNNING, case
        assert result.requeue_after <= SETTINGS.poll_seconds, case
    steady = plan(observed(job, list(now), heartbeat=beat), now=at(110), settings=SETTINGS)
    assert steady.requeue_after == SETTINGS.steady_poll_seconds


def test_a_job_that_turned_running_in_this_reconcile_keeps_the_short_poll() -> None:
    job = running_job()
    job["status"]["phase"] = "Starting"
    result = plan(
        observed(job, workers(job), heartbeat=lease(renewed=105, step=40)),
        now=at(110),
        settings=SETTINGS,
    )
    assert result.status.phase is Phase.RUNNING
    assert result.requeue_after == SETTINGS.poll_seconds


def test_a_silent_hang_is_found_at_the_deadline_it_was_looked_at_by() -> None:
    job = running_job(stall=30)
    beat = lease(renewed=100, step=40)
    first = plan(observed(job, workers(job), heartbeat=beat), now=at(110), settings=SETTINGS)
    looked = at(110 + first.requeue_after)
    assert looked > at(130)
    hung = plan(observed(job, workers(job), heartbeat=beat), now=looked, settings=SETTINGS)
    assert hung.diagnosis is not None
    assert hung.diagnosis.code.value == "HANG"


def waiting_on_node(manifest: dict[str, Any], reason: str) -> dict[str, Any]:
    """`manifest` (a pod) bound to its node at T0, its container waiting for `reason`."""
    manifest["status"] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(T0)}],
        "containerStatuses": [{"name": "trainer", "state": {"waiting": {"reason": reason}}}],
    }
    return manifest


@pytest.mark.parametrize(
    ("case", "waiting", "now", "expected"),
    [
        # The scheduler has not placed worker 1 since 100 s: named at 115 s.
        ("unplaced, within the grace", "unplaced", 110, UNSCHEDULABLE_GRACE_SECONDS - 10),
        # Named already: the scheduler's binding is an event.
        ("unplaced, named", "unplaced", 200, 60.0),
        # On its node since T0, its container not started: named at 60 s.
        ("not started, within the grace", "ContainerCreating", 20, NOT_STARTED_GRACE_SECONDS - 20),
        ("not started, named", "ContainerCreating", 200, 60.0),
        # A start the kubelet refused is judged a failure after its grace: the short poll.
        ("start refused", "ErrImagePull", 10, 5.0),
    ],
)
def test_a_starting_job_whose_pods_wait_is_looked_at_by_its_start_graces_under_the_net(
    case: str, waiting: str, now: float, expected: float
) -> None:
    job = job_body(status=running_status(phase=Phase.STARTING.value))
    worker = (
        refused(pod(job, 1, 0, 1, phase="Pending"), "0/8 nodes are available", since=100)
        if waiting == "unplaced"
        else waiting_on_node(pod(job, 1, 0, 1, phase="Pending"), waiting)
    )
    result = plan(observed(job, [pod(job, 1, 0, 0), worker]), now=at(now), settings=SETTINGS)
    assert result.status.phase is Phase.STARTING, case
    assert result.diagnosis is None, case
    assert result.requeue_after == pytest.approx(expected), case
