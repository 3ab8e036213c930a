"""A job's failed nodes: avoided until the cluster shows them repaired, counted for good."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.operator.builders import (
    at,
    cluster,
    job_body,
    node,
    observed,
    pod,
    running_status,
    trainer_message,
)

from tpujob import contract, labels
from tpujob.api import BadNodeAction, FailedNode
from tpujob.failed_nodes import avoided_nodes, record_blames, repaired
from tpujob.observed import node_view
from tpujob.planning import plan

BLAMED_UID = "uid-before-repair"


@pytest.mark.parametrize(
    ("failed", "now", "action", "is_repaired"),
    [
        # The same Node object, still tainted: broken as far as anyone knows.
        (
            {"uid": BLAMED_UID, "marked": True},
            {"uid": BLAMED_UID, "taints": (labels.BAD_NODE_TAINT,)},
            BadNodeAction.TAINT,
            False,
        ),
        # A new Node under the name: the VM was recreated.
        ({"uid": BLAMED_UID, "marked": True}, {"uid": "uid-new"}, BadNodeAction.TAINT, True),
        ({"uid": BLAMED_UID, "job_only": True}, {"uid": "uid-new"}, BadNodeAction.TAINT, True),
        # The job's own mark taken off by someone: they declared it fixed.
        ({"uid": BLAMED_UID, "marked": True}, {"uid": BLAMED_UID}, BadNodeAction.TAINT, True),
        ({"uid": BLAMED_UID, "marked": True}, {"uid": BLAMED_UID}, BadNodeAction.CORDON, True),
        (
            {"uid": BLAMED_UID, "marked": True},
            {"uid": BLAMED_UID, "unschedulable": True},
            BadNodeAction.CORDON,
            False,
        ),
        # Never seen marked: the mark is still due, so no one has cleared it.
        ({"uid": BLAMED_UID}, {"uid": BLAMED_UID}, BadNodeAction.TAINT, False),
        # A job-only blame is never marked; the same node, untainted, is what it always was.
        ({"uid": BLAMED_UID, "job_only": True}, {"uid": BLAMED_UID}, BadNodeAction.TAINT, False),
        # Blamed before uids were recorded: only a cleared mark tells.
        ({}, {"uid": "uid-new"}, BadNodeAction.TAINT, False),
        ({"marked": True}, {"uid": "uid-new"}, BadNodeAction.TAINT, True),
        # badNodeAction none: nothing was marked, nothing to be cleared.
        ({"uid": BLAMED_UID}, {"uid": BLAMED_UID}, BadNodeAction.NONE, False),
        # Gone: nothing says it was fixed.
        ({"uid": BLAMED_UID, "marked": True}, None, BadNodeAction.TAINT, False),
    ],
    ids=[
        "still-tainted",
        "recreated",
        "recreated-job-only",
        "taint-cleared",
        "cordon-cleared",
        "still-cordoned",
        "mark-still-due",
        "job-only-same-node",
        "no-uid-recorded",
        "no-uid-but-cleared",
        "action-none",
        "node-gone",
    ],
)
def test_a_failed_node_is_repaired_only_when_the_cluster_shows_it(
    failed: dict[str, Any], now: dict[str, Any] | None, action: BadNodeAction, is_repaired: bool
) -> None:
    record = FailedNode(name="n", **failed)
    view = node_view(node("n", "pool-0", **now)) if now is not None else None
    assert repaired(record, view, action) is is_repaired


def test_a_repaired_node_blamed_again_is_recorded_afresh_and_counted_once() -> None:
    nodes = {
        "n": node_view(node("n", "pool-0", uid="uid-new")),
        "m": node_view(node("m", "pool-1", uid="uid-m")),
    }
    before = [FailedNode(name="n", uid=BLAMED_UID, marked=True, code="NODE_LOST", time=at(0))]
    after = record_blames(
        before,
        blame=("n", "m"),
        mark=("n",),
        nodes=nodes,
        action=BadNodeAction.TAINT,
        code="TPU_UNHEALTHY",
        now=at(60),
    )
    assert [(f.name, f.uid, f.marked, f.job_only, f.code) for f in after] == [
        ("n", "uid-new", None, None, "TPU_UNHEALTHY"),
        ("m", "uid-m", None, True, "TPU_UNHEALTHY"),
    ]
    assert avoided_nodes(after, nodes, BadNodeAction.TAINT) == {"n", "m"}


def test_a_failed_node_not_blamed_again_keeps_its_record() -> None:
    nodes = {"n": node_view(node("n", "pool-0", uid="uid-new"))}
    before = [FailedNode(name="n", uid=BLAMED_UID, marked=True, code="NODE_LOST", time=at(0))]
    after = record_blames(
        before,
        blame=(),
        mark=(),
        nodes=nodes,
        action=BadNodeAction.TAINT,
        code="PROCESS_KILLED",
        now=at(60),
    )
    assert after == before
    assert avoided_nodes(after, nodes, BadNodeAction.TAINT) == frozenset()


def _lost_on_pool_0() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A job on pool-0 whose worker 1 was killed, pool-1 blamed for a lost node before."""
    failed = {
        "name": "pool-1-w0",
        "uid": BLAMED_UID,
        "marked": True,
        "code": "NODE_LOST",
        "time": "2026-01-01T12:00:00Z",
    }
    job = job_body(status=running_status(attempt=2, pools=("pool-0",), failedNodes=[failed]))
    killed = trainer_message(contract.ExitCode.UNKNOWN_ERROR, "worker killed", step=30)
    pods = [
        pod(job, 2, 0, 0, node_name="pool-0-w0"),
        pod(
            job,
            2,
            0,
            1,
            node_name="pool-0-w1",
            phase="Failed",
            exit_code=137,
            message=killed,
            reason="Error",
        ),
    ]
    return job, pods


@pytest.mark.parametrize(
    ("pool_1_w0", "avoided"),
    [
        ({"uid": BLAMED_UID, "taints": (labels.BAD_NODE_TAINT,)}, True),
        ({"uid": "uid-recreated"}, False),
    ],
    ids=["still-broken", "recreated-by-repair"],
)
def test_the_next_attempts_pods_avoid_a_failed_node_until_it_is_repaired(
    pool_1_w0: dict[str, Any], avoided: bool
) -> None:
    job, pods = _lost_on_pool_0()
    nodes = cluster(2, **{"pool-1-w0": pool_1_w0})
    result = plan(observed(job, pods, nodes=nodes), now=at(20))
    assert result.status.attempt == 3, result.status.last_failure
    # Counted for good, whichever way: the budget is about nodes that failed.
    assert [n.name for n in result.status.failed_nodes] == ["pool-1-w0"]
    assert result.status.failed_node_budget_left == 0
    # The old pods gone, the next reconcile launches the new attempt.
    relaunch = job_body(
        status=result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    )
    launched = plan(observed(relaunch, [], nodes=nodes), now=at(40))
    created = [o for o in launched.create if o["kind"] == "Pod"]
    assert len(created) == 2, launched.status.conditions
    for manifest in created:
        affinity = manifest["spec"].get("affinity")
        assert (affinity is not None) is avoided, affinity
