"""A heartbeat that aged while the API server was down is no hang: the trainers could not renew."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, running_status

from tpujob.plan.planner import plan


def stalled_at(now: float, *, reachable_since: datetime | None, stepped: bool = True) -> bool:
    """Whether the plan at `now` restarts a job whose last beat was at 10 s (stall timeout 20 s,
    start-up timeout 60 s); not `stepped`: the beat is the attempt's announcement."""
    job = job_body(
        status=running_status(), recovery={"stallTimeoutSeconds": 20, "startupTimeoutSeconds": 60}
    )
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    beat = lease(renewed=10, step=40 if stepped else None, attempt=1)
    obs = replace(observed(job, pods, heartbeat=beat), heartbeats_seen_since=reachable_since)
    return plan(obs, now=at(now)).status.attempt == 2


@pytest.mark.parametrize(
    ("now", "reachable_since", "hang"),
    [
        (35, None, True),  # no record of the API: the whole age counts
        (45, at(40), False),  # the API came back 5 s ago: the trainers have not had the chance
        (59, at(40), False),
        (61, at(40), True),  # a whole stall timeout since the API's return without a beat
        (45, at(0), True),  # the API was there all along
    ],
    ids=[
        "no-record",
        "just-back",
        "within-timeout-of-return",
        "timeout-after-return",
        "never-down",
    ],
)
def test_a_heartbeat_ages_only_while_the_api_is_reachable(
    now: float, reachable_since: datetime | None, hang: bool
) -> None:
    assert stalled_at(now, reachable_since=reachable_since) is hang


def test_start_up_time_lost_to_an_api_outage_is_given_back() -> None:
    # Announced, no step yet: start-up gets its timeout (60 s), counted from the API's return.
    assert stalled_at(75, reachable_since=None, stepped=False)
    assert not stalled_at(75, reachable_since=at(30), stepped=False)
    assert stalled_at(95, reachable_since=at(30), stepped=False)
