"""A pool whose chips something the operator does not watch holds is placed last on restart."""

from __future__ import annotations

import pytest
from tests.unit.builders import at, cluster, job_body, observed, pod, refused, running_status

from tpujob.plan.planner import plan

REFUSED = "0/7 nodes are available: 2 Insufficient google.com/tpu, 5 node(s) didn't match"


@pytest.mark.parametrize(
    ("case", "message", "want"),
    [
        ("refused for want of chips: another pool", REFUSED, "pool-2"),
        (
            "refused for another reason: the same pool",
            "0/7 nodes are available: 2 Too many pods",
            "pool-1",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_restart_places_a_slice_refused_for_want_of_chips_elsewhere(
    case: str, message: str, want: str
) -> None:
    job = job_body(slices=2, status=running_status(pools=("pool-0", "pool-1"), phase="Starting"))
    pods = [pod(job, 1, 0, 0, phase="Failed", exit_code=137), pod(job, 1, 0, 1)]
    pods += [refused(pod(job, 1, 1, w), message) for w in range(2)]
    result = plan(observed(job, pods, nodes=cluster(3)), now=at(40))
    assert result.status.attempt == 2, result.status.last_failure
    placement = {p.slice: p.node_pool for p in result.status.current_attempt.placement}
    assert placement == {0: "pool-0", 1: want}, case
