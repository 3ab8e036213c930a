"""A job's failed nodes: avoided until the cluster shows them repaired, counted for good."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import (
    at,
    cluster,
    job_body,
    node,
    observed,
    pod,
    running_status,
    trainer_message,
)

from tpujob.api import BadNodeAction, FailedNode, contract, labels
from tpujob.observed.views import node_view
from tpujob.plan.failed_nodes import (
    avoided_nodes,
    mark_reason,
    marked_by,
    record_blames,
    repaired,
    return_due,
)
from tpujob.plan.planner import plan

BLAMED_UID = "uid-before-repair"
RETURN = 300.0  # seconds a lost node must stay back before its blamer trusts it again


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
    assert repaired(record, view, action, now=at(0), return_after=RETURN) is is_repaired


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
        return_after=RETURN,
    )
    assert [(f.name, f.uid, f.marked, f.job_only, f.code) for f in after] == [
        ("n", "uid-new", None, None, "TPU_UNHEALTHY"),
        ("m", "uid-m", None, True, "TPU_UNHEALTHY"),
    ]
    assert avoided_nodes(after, nodes, BadNodeAction.TAINT, now=at(60), return_after=RETURN) == {
        "n",
        "m",
    }


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
        return_after=RETURN,
    )
    assert after == before
    assert (
        avoided_nodes(after, nodes, BadNodeAction.TAINT, now=at(60), return_after=RETURN)
        == frozenset()
    )


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


LOST_AT = at(0)


def _lost(name: str = "n", **extra: Any) -> FailedNode:
    return FailedNode(
        name=name, uid=BLAMED_UID, marked=True, code="NODE_LOST", time=LOST_AT, **extra
    )


@pytest.mark.parametrize(
    ("failed", "now", "seconds_back", "due"),
    [
        # Back since 60 s after the blame, for 200 s: 100 s to go.
        (_lost(), {}, 200, 100.0),
        (_lost(), {}, 300, 0.0),
        # Ready since before the blame: never seen to go and come back.
        (_lost(), {}, None, None),
        # Lost again after it came back once: not trusted a second time.
        (_lost(relapsed=True), {}, 400, None),
        # Blamed for something other than being lost: coming back Ready says nothing.
        (_lost().model_copy(update={"code": "TPU_UNHEALTHY"}), {}, 400, None),
        # Back but not whole: TPUs held back, still unreachable, or under maintenance.
        (_lost(), {"tpu": 2}, 400, None),
        (_lost(), {"taints": (labels.UNREACHABLE_TAINT,)}, 400, None),
        (_lost(), {"ready": "Unknown"}, 400, None),
        (_lost(), {"taints": labels.MAINTENANCE_TAINTS[:1]}, 400, None),
    ],
    ids=[
        "back-not-long-enough",
        "back-long-enough",
        "never-left",
        "relapsed",
        "blamed-for-tpus",
        "tpus-short",
        "still-unreachable",
        "still-not-ready",
        "under-maintenance",
    ],
)
def test_a_lost_node_is_trusted_again_only_once_back_whole_for_a_while(
    failed: FailedNode, now: dict[str, Any], seconds_back: float | None, due: float | None
) -> None:
    current = at(60 + (seconds_back or 0))
    since = at(60) if seconds_back is not None else at(-600)
    # Still tainted by the job: only coming back can make it repaired here.
    taints = (labels.BAD_NODE_TAINT, *now.pop("taints", ()))
    view = node_view(node("n", "pool-0", uid=BLAMED_UID, ready_since=since, taints=taints, **now))
    assert return_due(failed, view, now=current, return_after=RETURN) == due
    trusted = repaired(failed, view, BadNodeAction.TAINT, now=current, return_after=RETURN)
    assert trusted is (due is not None and due <= 0)


def test_a_node_lost_again_after_it_came_back_has_relapsed() -> None:
    back = node_view(node("n", "pool-0", uid=BLAMED_UID, ready_since=at(60)))
    now = at(60 + RETURN)
    assert repaired(_lost(), back, BadNodeAction.TAINT, now=now, return_after=RETURN)
    after = record_blames(
        [_lost()],
        blame=("n",),
        mark=("n",),
        nodes={"n": back},
        action=BadNodeAction.TAINT,
        code="NODE_LOST",
        now=now,
        return_after=RETURN,
    )
    assert [(f.name, f.relapsed, f.time) for f in after] == [("n", True, now)]
    later = at(60 + 3 * RETURN)
    again = node_view(
        node("n", "pool-0", uid=BLAMED_UID, ready_since=now, taints=(labels.BAD_NODE_TAINT,))
    )
    assert avoided_nodes(after, {"n": again}, BadNodeAction.TAINT, now=later, return_after=RETURN)
    # A new Node object under the name still ends it: the VM was recreated.
    recreated = node_view(node("n", "pool-0", uid="uid-new", ready_since=now))
    assert not avoided_nodes(
        after, {"n": recreated}, BadNodeAction.TAINT, now=later, return_after=RETURN
    )


@pytest.mark.parametrize(
    ("reason", "who"),
    [
        (mark_reason("team", "train", "NODE_LOST"), ("team", "train")),
        ("team/train: NODE_LOST", ("team", "train")),
        ("an administrator's note", None),
        ("a/b/c: x", None),
        (None, None),
        ("", None),
    ],
)
def test_the_job_that_marked_a_node_is_read_from_its_reason(
    reason: str | None, who: tuple[str, str] | None
) -> None:
    assert marked_by(reason) == who


def _running_with_a_lost_node(reason: str | None, back_since: float) -> Any:
    """A job on pool-0 that blamed and marked pool-1-w0 lost at 0 s; the node has been back
    (the same Node object, Ready) since `back_since`, still carrying the taint."""
    failed = _lost(name="pool-1-w0").model_dump(mode="json", by_alias=True, exclude_none=True)
    job = job_body(status=running_status(attempt=2, pools=("pool-0",), failedNodes=[failed]))
    pods = [pod(job, 2, 0, w, node_name=f"pool-0-w{w}") for w in range(2)]
    nodes = cluster(
        2,
        **{
            "pool-1-w0": {
                "uid": BLAMED_UID,
                "ready_since": at(back_since),
                "taints": (labels.BAD_NODE_TAINT,),
                "annotations": {labels.BAD_NODE_REASON: reason} if reason else {},
            }
        },
    )
    return observed(job, pods, nodes=nodes)


OURS = mark_reason("team", "train", "NODE_LOST")


@pytest.mark.parametrize(
    ("reason", "now", "cleared"),
    [
        (OURS, 60 + RETURN, True),
        (OURS, 60 + RETURN - 1, False),
        # Another job marked it first (its reason is on the node): that mark is not ours.
        (mark_reason("other", "job", "NODE_LOST"), 60 + RETURN, False),
        (None, 60 + RETURN, False),
    ],
    ids=["ours-back-long-enough", "ours-not-yet", "another-jobs-mark", "no-reason"],
)
def test_a_job_takes_off_only_its_own_mark_of_a_lost_node_that_came_back(
    reason: str | None, now: float, cleared: bool
) -> None:
    result = plan(_running_with_a_lost_node(reason, back_since=60), now=at(now))
    clears = [m for m in result.mark_nodes if m.clear]
    assert [(m.node, m.reason) for m in clears] == ([("pool-1-w0", OURS)] if cleared else [])
    assert not [m for m in result.mark_nodes if not m.clear]  # never marked again
    # Counted for good either way.
    assert [n.name for n in result.status.failed_nodes] == ["pool-1-w0"]


def test_a_job_asks_to_be_woken_when_its_lost_node_has_been_back_long_enough() -> None:
    result = plan(_running_with_a_lost_node(OURS, back_since=60), now=at(60 + RETURN - 20))
    assert result.requeue_after <= 20


def test_taking_a_mark_off_is_told_once_however_many_reconciles_see_it_due() -> None:
    told = [
        [
            e.at
            for e in plan(_running_with_a_lost_node(OURS, back_since=60), now=at(t)).events
            if e.reason == "NodeTrustedAgain"
        ]
        for t in (60 + RETURN, 60 + RETURN + 7, 60 + RETURN + 90)
    ]
    # One Event, at the moment it fell due: its name (derived from it) is the same each time.
    assert told == [[at(60 + RETURN)]] * 3
