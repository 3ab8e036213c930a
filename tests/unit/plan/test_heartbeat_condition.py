"""The Heartbeat condition says whether a hang of the job's trainer would be seen, and why not."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, running_status

from tpujob.api import ConditionType
from tpujob.plan.planner import plan


def heartbeat_condition(
    now: float,
    *,
    beat: dict[str, Any] | None,
    recovery: dict[str, Any] | None = None,
    before: str | None = None,
) -> tuple[str, str] | None:
    """(status, reason) of the Heartbeat condition planned at `now` (workers running from 0 s);
    `before`: the condition's status as the job had it."""
    status = running_status()
    if before is not None:
        status["conditions"] = [
            {"type": "Heartbeat", "status": before, "reason": "Announced", "message": "x"}
        ]
    job = job_body(status=status, recovery=recovery or {})
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    result = plan(observed(job, pods, heartbeat=beat), now=at(now))
    found = result.status.condition(ConditionType.HEARTBEAT)
    return (str(found.status), str(found.reason)) if found is not None else None


@pytest.mark.parametrize(
    ("now", "beat", "recovery", "before", "expected"),
    [
        (30, lease(renewed=2, step=None, attempt=1), None, None, ("True", "Announced")),
        (30, lease(renewed=20, step=12, attempt=1), None, None, ("True", "Announced")),
        # Silent, but within the grace every trainer gets to start: nothing said yet.
        (60, None, None, None, None),
        (200, None, None, None, ("False", "NotAnnounced")),
        # An earlier attempt's Lease is no announcement of this one.
        (200, lease(renewed=-50, step=40, attempt=0), None, None, ("False", "NotAnnounced")),
        # It spoke before: this attempt is slow to start, not a trainer without the contract.
        (200, None, None, "True", ("True", "Announced")),
        (
            30,
            lease(renewed=20, step=12, attempt=1),
            {"stallTimeoutSeconds": 0},
            None,
            ("False", "StallDetectionOff"),
        ),
    ],
    ids=[
        "announced",
        "stepping",
        "silent-within-grace",
        "silent-after-grace",
        "only-an-earlier-attempts-beat",
        "spoke-in-an-earlier-attempt",
        "off",
    ],
)
def test_the_heartbeat_condition_says_whether_a_hang_would_be_seen(
    now: float,
    beat: dict[str, Any] | None,
    recovery: dict[str, Any] | None,
    before: str | None,
    expected: tuple[str, str] | None,
) -> None:
    assert heartbeat_condition(now, beat=beat, recovery=recovery, before=before) == expected


def test_a_silent_trainer_is_never_restarted_as_hung() -> None:
    job = job_body(status=running_status(), recovery={"stallTimeoutSeconds": 10})
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    for now in (100, 1_000, 100_000):
        result = plan(observed(job, pods), now=at(now))
        assert result.status.attempt == 1 and result.diagnosis is None
