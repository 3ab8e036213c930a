"""A pod the scheduler has not placed is told in the Running condition once it has waited a
while, and its message does not change the status while the same pod waits."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, job_body, observed, pod, refused, running_status

from tpujob.api import ConditionType, Phase
from tpujob.controller.reconcile import status_patch
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan
from tpujob.plan.starting import UNSCHEDULABLE_GRACE_SECONDS

SAID = "0/101 nodes are available: 2 Insufficient google.com/tpu, 99 node(s) didn't match"
SAID_LATER = "0/101 nodes are available: 2 Insufficient google.com/tpu, 40 node(s) had taints"


def unplaced(job: dict[str, Any], worker: int, message: str, since: float) -> dict[str, Any]:
    return refused(pod(job, 1, 0, worker, phase="Pending"), message, since=since)


def planned(job: dict[str, Any], message: str, now: float) -> Plan:
    pods = [pod(job, 1, 0, 0, phase="Pending"), unplaced(job, 1, message, since=10)]
    return plan(observed(job, pods), now=at(now))


def starting() -> dict[str, Any]:
    return job_body(status=running_status(phase=Phase.STARTING.value))


@pytest.mark.parametrize(
    ("waited", "told"),
    [
        (1.0, False),
        (UNSCHEDULABLE_GRACE_SECONDS - 1, False),
        (UNSCHEDULABLE_GRACE_SECONDS, True),
        (UNSCHEDULABLE_GRACE_SECONDS * 4, True),
    ],
)
def test_a_pod_is_said_unschedulable_once_it_has_waited_the_grace(
    waited: float, told: bool
) -> None:
    result = planned(starting(), SAID, now=10 + waited)
    running = result.status.condition(ConditionType.RUNNING)
    said = running is not None and running.reason == "Unschedulable"
    assert said is told
    if told:
        assert running is not None and running.message == f"pod train-1-0-1: {SAID}"
    else:  # woken when the grace ends, not a poll later
        assert result.requeue_after <= UNSCHEDULABLE_GRACE_SECONDS - waited + 1e-6


def test_the_schedulers_changing_counts_for_the_same_pod_write_no_status() -> None:
    first = planned(starting(), SAID, now=40)
    job = job_body(status=first.status.model_dump(mode="json", by_alias=True, exclude_none=True))
    later = planned(job, SAID_LATER, now=45)
    assert status_patch(later.status) == status_patch(first.status) | {
        "goodputBreakdown": status_patch(later.status).get("goodputBreakdown")
    }


def test_the_pod_named_stays_named_while_it_waits_and_the_last_waiting_is_named_first() -> None:
    """The scheduler places a gang's pods in order: the last waiting pod is named, and one
    pod placed of several waiting writes no status while the pod named still waits."""
    job = starting()

    def named(job: dict[str, Any], waiting: list[int], now: float) -> tuple[str, dict[str, Any]]:
        pods = [
            unplaced(job, w, SAID, since=10) if w in waiting else pod(job, 1, 0, w) for w in (0, 1)
        ]
        result = plan(observed(job, pods), now=at(now))
        running = result.status.condition(ConditionType.RUNNING)
        assert running is not None and running.reason == "Unschedulable"
        status = result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
        return str(running.message).split(":")[0], job_body(status=status)

    said, job = named(job, [0, 1], now=40)
    assert said == "pod train-1-0-1"
    said, job = named(job, [1], now=41)  # the first placed: the one named still waits
    assert said == "pod train-1-0-1"
    job = starting()
    said, job = named(job, [0, 1], now=40)
    said, job = named(job, [0], now=41)  # the one named placed: the one still waiting is named
    assert said == "pod train-1-0-0"
    said, job = named(job, [0, 1], now=42)  # another waits again: the one named still does
    assert said == "pod train-1-0-0"
