"""A heartbeat's age is counted by the operator's clock, from when it saw the renewal: a trainer
host's clock that is slow or fast neither fakes a hang nor hides one."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, running_status

from tpujob.kube.cache import BeatBook, lease_record
from tpujob.plan.planner import plan


def restarts_at(now: float, *, renewed: float, seen: float | None) -> bool:
    """Whether the plan at `now` restarts a running job (stall timeout 20 s) whose trainer
    wrote renewTime `renewed` by its clock, seen by the operator at `seen` by its own."""
    job = job_body(status=running_status(), recovery={"stallTimeoutSeconds": 20})
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    obs = observed(job, pods, heartbeat=lease(renewed=renewed, step=40))
    assert obs.heartbeat is not None
    beat = replace(obs.heartbeat, seen=at(seen) if seen is not None else None)
    return plan(replace(obs, heartbeat=beat), now=at(now)).status.attempt == 2


@pytest.mark.parametrize(
    ("now", "renewed", "seen", "hang"),
    [
        (100, 68, 98, False),  # the trainer's clock 30 s slow: renewed 2 s ago, not 32
        (100, 3700, 70, True),  # an hour fast: 30 s without a renewal is a hang all the same
        (100, 98, 70, True),  # the renewTime says fresh, but nothing new was seen for 30 s
        (100, 70, None, True),  # not witnessed (no book): the trainer's clock is all there is
        (100, 90, None, False),
    ],
    ids=["trainer-slow", "trainer-fast", "stale-renewal-time", "unwitnessed", "unwitnessed-fresh"],
)
def test_a_heartbeats_age_is_the_operators(
    now: float, renewed: float, seen: float | None, hang: bool
) -> None:
    assert restarts_at(now, renewed=renewed, seen=seen) is hang


def test_a_renewal_is_stamped_once_when_first_seen() -> None:
    clock = [at(0)]
    book = BeatBook(clock=lambda: clock[0])
    raw = lease(renewed=5, step=3)
    raw["metadata"].update(
        name="train-heartbeat",
        namespace="team",
        ownerReferences=[{"kind": "TPUTrainingJob", "name": "train", "uid": "u"}],
    )
    [first] = lease_record(raw, book).values()
    clock[0] += timedelta(seconds=7)  # the same renewal shown again (a relist, a fence patch)
    [again] = lease_record(raw, book).values()
    raw["spec"]["renewTime"] = "2026-01-01T12:00:09Z"
    [renewed] = lease_record(raw, book).values()
    assert (first.seen, again.seen, renewed.seen) == (at(0), at(0), at(7))
