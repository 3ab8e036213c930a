"""Elastic jobs: fewer slices after a hard failure leaves no pool, and back to all of them."""

from __future__ import annotations

from dataclasses import replace
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
    reported,
    running_status,
)

from tpujob.api import Phase, contract, labels, parse_job
from tpujob.api.enums import ConditionType
from tpujob.api.job import InvalidJobError
from tpujob.api.reasons import ConditionReason, TimelineKind
from tpujob.plan.goodput import breakdown
from tpujob.plan.planner import plan
from tpujob.plan.reports import waits_for_pool
from tpujob.plan.result import Plan

LOST = {"ready": "Unknown", "taints": (labels.UNREACHABLE_TAINT,)}


def elastic_job(
    *, slices: int = 2, min_slices: int | None = 1, status: dict[str, Any] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {} if min_slices is None else {"elastic": {"minSlices": min_slices}}
    pools = tuple(f"pool-{s}" for s in range(slices))
    if status is None:
        status = running_status(pools=pools)
    return job_body(slices=slices, status=status, **spec)


def then(job: dict[str, Any], result: Plan) -> dict[str, Any]:
    """`job` with the status `result` wrote."""
    status = result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {**job, "status": status}


def gang(job: dict[str, Any], attempt: int, slices: int) -> list[dict[str, Any]]:
    return [pod(job, attempt, s, w) for s in range(slices) for w in range(2)]


def created(result: Plan) -> list[dict[str, Any]]:
    return [o for o in result.create if o["kind"] == "Pod"]


def env_of(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in manifest["spec"]["containers"][0]["env"]}


def kinds(result: Plan) -> list[str]:
    return [e.kind for e in result.status.timeline]


def pools(result: Plan) -> dict[int, str]:
    return {p.slice: p.node_pool for p in result.status.current_attempt.placement}


def degraded_launch(**kwargs: Any) -> Plan:
    """A two-slice job whose pool-1 lost a node with no pool left: the failure, then the
    launch of the next attempt once the old pods are gone."""
    job = elastic_job(**kwargs)
    nodes = cluster(2, **{"pool-1-w1": LOST})
    failed = plan(observed(job, gang(job, 1, 2), nodes=nodes), now=at(20))
    job = then(job, failed)
    return plan(observed(job, [], nodes=nodes), now=at(30))


def test_a_hard_failure_with_no_pool_left_runs_the_next_attempt_on_the_slices_that_have_one() -> (
    None
):
    launched = degraded_launch()
    status = launched.status
    assert status.attempt == 2
    assert status.restarts.hard == 1
    assert status.current_attempt.slices == 1
    assert pools(launched) == {0: "pool-0"}
    names = sorted(p["metadata"]["name"] for p in created(launched))
    assert names == ["train-2-0-0", "train-2-0-1"]
    env = env_of(created(launched)[0])
    assert env["MEGASCALE_NUM_SLICES"] == "1"
    assert env["JAX_NUM_PROCESSES"] == "2"
    assert env[contract.ENV_PLANNED_SLICES] == "2"
    assert TimelineKind.DEGRADED in kinds(launched)
    assert waits_for_pool(status)


@pytest.mark.parametrize(
    ("case", "slices", "min_slices", "lost_pools", "want"),
    [
        ("not elastic: it waits for a pool", 2, None, 1, None),
        ("elastic, one of two slices left", 2, 1, 1, 1),
        ("elastic, two of three left", 3, 2, 1, 2),
        ("elastic, one of three left, fewer than minSlices: it waits", 3, 2, 2, None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_next_attempt_launches_smaller_only_down_to_min_slices(
    case: str, slices: int, min_slices: int | None, lost_pools: int, want: int | None
) -> None:
    job = elastic_job(slices=slices, min_slices=min_slices)
    job["spec"]["recovery"]["maxFailedNodes"] = lost_pools
    lost = {f"pool-{slices - 1 - p}-w1": LOST for p in range(lost_pools)}
    nodes = cluster(slices, **lost)
    failed = plan(observed(job, gang(job, 1, slices), nodes=nodes), now=at(20))
    assert failed.status.restarts.hard == 1, case
    launched = plan(observed(then(job, failed), [], nodes=nodes), now=at(30))
    pods = created(launched)
    if want is None:
        assert pods == []
        running = launched.status.condition(ConditionType.RUNNING)
        assert running is not None and running.reason == ConditionReason.WAITING_FOR_POOL
    else:
        assert launched.status.current_attempt.slices == want
        assert len(pods) == want * 2
        assert {env_of(p)["MEGASCALE_NUM_SLICES"] for p in pods} == {str(want)}


def test_a_new_elastic_job_waits_for_every_slice_rather_than_starting_smaller() -> None:
    job = elastic_job(status={})
    nodes = cluster(2, **{"pool-1-w1": LOST})
    result = plan(observed(job, [], nodes=nodes), now=at(0))
    assert created(result) == []
    assert result.status.current_attempt.slices is None


def test_a_failure_that_may_shrink_the_job_keeps_no_slice_in_place() -> None:
    job = elastic_job()
    nodes = cluster(2, **{"pool-1-w1": LOST})
    beat = lease(renewed=9, step=30)
    beat["metadata"]["annotations"][contract.HEARTBEAT_REJOINS] = "true"
    failed = plan(observed(job, gang(job, 1, 2), nodes=nodes, heartbeat=beat), now=at(20))
    assert failed.status.current_attempt.kept_slices == ()
    assert failed.status.current_attempt.resizable


def degraded_running(attempt: int = 2, phase: str = "Running") -> dict[str, Any]:
    status = running_status(attempt=attempt, pools=("pool-0",), phase=phase)
    status["currentAttempt"].update({"slices": 1, "resizable": True})
    status["restarts"] = {"hard": 1, "total": 1}
    return elastic_job(status=status)


def test_a_smaller_attempt_grows_back_when_a_pool_is_usable_again() -> None:
    job = degraded_running()
    result = plan(observed(job, gang(job, 2, 1), nodes=cluster(2)), now=at(60))
    status = result.status
    assert status.attempt == 3
    assert status.phase is Phase.RECOVERING
    assert status.restarts.total == 1  # growing back is no failure
    assert status.current_attempt.slices is None
    assert status.current_attempt.graceful
    assert pools(result) == {0: "pool-0", 1: "pool-1"}
    assert TimelineKind.RESIZED in kinds(result)
    running = status.condition(ConditionType.RUNNING)
    assert running is not None and running.reason == ConditionReason.RESIZING
    # The degraded attempt is on record as such: its time counts as degraded.
    assert [r.slices for r in status.attempt_history] == [1]


@pytest.mark.parametrize(
    ("case", "nodes", "busy"),
    [
        ("the lost node is still down", cluster(2, **{"pool-1-w1": LOST}), frozenset()),
        ("the pool is another job's", cluster(2), frozenset({"pool-1"})),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_smaller_attempt_runs_on_while_no_pool_is_usable(
    case: str, nodes: list[dict[str, Any]], busy: frozenset[str]
) -> None:
    job = degraded_running(phase="Recovering")  # its workers all run: it turns Running
    obs = replace(observed(job, gang(job, 2, 1), nodes=nodes), busy_pools=busy)
    result = plan(obs, now=at(60))
    assert result.status.attempt == 2, case
    assert result.status.phase is Phase.RUNNING
    running = result.status.condition(ConditionType.RUNNING)
    assert running is not None and "on 1 of 2 slices" in running.message
    assert TimelineKind.RESIZED not in kinds(result)


def test_a_grown_attempt_whose_new_pool_was_taken_meanwhile_launches_on_what_it_has() -> None:
    job = degraded_running()
    grown = plan(observed(job, gang(job, 2, 1), nodes=cluster(2)), now=at(60))
    job = then(job, grown)
    obs = replace(observed(job, [], nodes=cluster(2)), busy_pools=frozenset({"pool-1"}))
    launched = plan(obs, now=at(70))
    assert launched.status.current_attempt.slices == 1
    assert sorted(p["metadata"]["name"] for p in created(launched)) == [
        "train-3-0-0",
        "train-3-0-1",
    ]


def test_the_goodput_breakdown_counts_the_time_spent_on_fewer_slices() -> None:
    job = degraded_running()
    job["status"]["currentAttempt"]["launchedTime"] = iso(at(100))
    status = parse_job(job).status
    parts = breakdown(status, None, now=at(160))
    assert parts is not None and parts.degraded == pytest.approx(60)
    whole = parse_job(elastic_job()).status
    parts = breakdown(whole, None, now=at(160))
    assert parts is not None and parts.degraded == 0


@pytest.mark.parametrize(
    ("slices", "min_slices", "valid"), [(2, 1, True), (2, 2, True), (2, 3, False), (1, 1, True)]
)
def test_min_slices_may_not_exceed_the_slices_asked_for(
    slices: int, min_slices: int, valid: bool
) -> None:
    body = elastic_job(slices=slices, min_slices=min_slices)
    if valid:
        assert parse_job(body).spec.elastic is not None
    else:
        with pytest.raises(InvalidJobError, match="minSlices"):
            parse_job(body)


def test_a_soft_failure_of_a_smaller_attempt_restarts_it_in_place_at_its_size() -> None:
    job = degraded_running()
    beat = reported(lease(renewed=85, step=40, attempt=2), 0, 1, at_seconds=80, attempt=2)
    beat["metadata"]["annotations"][contract.HEARTBEAT_REJOINS] = "true"
    # A trainer process ended in its pod, which lives on: every trainer restarts in its pod,
    # at the attempt's size, though the job's other slice still has no pool.
    nodes = cluster(2, **{"pool-1-w1": LOST})
    result = plan(observed(job, gang(job, 2, 1), nodes=nodes, heartbeat=beat), now=at(90))
    current = result.status.current_attempt
    assert result.status.restarts.soft == 1, result.status.last_failure
    assert [k.slice for k in current.kept_slices] == [0]
    assert current.slices == 1
    assert pools(result) == {0: "pool-0"}
