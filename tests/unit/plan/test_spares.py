"""Warm spares: the pools a job holds for its hard failures, taken, used, refilled, let go."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import T0, at, cluster, iso, job_body, observed, pod, running_status

from tpujob.api import Phase, labels, parse_job
from tpujob.api.reasons import TimelineKind
from tpujob.observed.views import Observed, pod_view
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan
from tpujob.plan.spares import SPARE_COMMAND, spare_pod, spare_pod_name


def spare_job(count: int = 1, **status: Any) -> dict[str, Any]:
    """A running job on pool-0 asking for `count` spares; `status` adds to its status."""
    body = job_body(status={**running_status(), **status})
    body["spec"]["tpu"]["spares"] = count
    return body


def idle(
    job: dict[str, Any], pool: str, worker: int, *, phase: str = "Running", name: str | None = None
) -> dict[str, Any]:
    """A spare's idle pod as the apiserver shows it."""
    manifest = spare_pod(parse_job(job), pool, worker)
    if name is not None:
        manifest["metadata"]["name"] = name
    manifest["metadata"]["uid"] = f"uid-{manifest['metadata']['name']}"
    manifest["metadata"]["creationTimestamp"] = iso(T0)
    manifest["spec"]["nodeName"] = f"{pool}-w{worker}"
    state: dict[str, Any] = {"running": {"startedAt": iso(T0)}}
    if phase == "Failed":
        state = {"terminated": {"exitCode": 127, "reason": "StartError"}}
    elif phase == "Pending":
        state = {"waiting": {"reason": "ContainerCreating"}}
    manifest["status"] = {"phase": phase, "containerStatuses": [{"name": "spare", "state": state}]}
    return manifest


def seen(
    job: dict[str, Any],
    spares: list[dict[str, Any]] = (),  # type: ignore[assignment]
    *,
    nodes: list[dict[str, Any]] | None = None,
    busy: frozenset[str] = frozenset(),
) -> Observed:
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    obs = observed(job, pods, nodes=nodes)
    return replace(obs, spares=tuple(pod_view(p) for p in spares), busy_pools=busy)


def created_spares(result: Plan) -> dict[str, str]:
    """name -> pool of the idle pods the plan creates."""
    return {
        o["metadata"]["name"]: o["spec"]["nodeSelector"][labels.NODEPOOL]
        for o in result.create
        if o["kind"] == "Pod" and o["metadata"]["labels"].get(labels.SPARE) == "true"
    }


def held(result: Plan) -> list[tuple[str, bool]]:
    return [(s.node_pool, s.ready) for s in result.status.spares]


def kinds(result: Plan) -> list[str]:
    return [e.kind for e in result.status.timeline]


def test_a_running_job_holds_a_free_pool_with_an_idle_pod_per_host() -> None:
    job = spare_job()
    result = plan(seen(job), now=at(20))
    assert created_spares(result) == {
        spare_pod_name("train", "pool-1", 0): "pool-1",
        spare_pod_name("train", "pool-1", 1): "pool-1",
    }
    manifest = next(o for o in result.create if o["metadata"]["labels"].get(labels.SPARE))
    container = manifest["spec"]["containers"][0]
    assert container["command"] == list(SPARE_COMMAND)
    assert container["image"] == "trainer:1"
    assert container["resources"]["limits"][labels.TPU_RESOURCE] == "4"
    assert manifest["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert held(result) == [("pool-1", False)]
    assert TimelineKind.SPARE_TAKEN in kinds(result)


@pytest.mark.parametrize(
    ("case", "nodes", "busy", "want"),
    [
        ("the first free pool by name", cluster(3), frozenset(), ["pool-1"]),
        ("not a pool another job holds", cluster(3), frozenset({"pool-1"}), ["pool-2"]),
        (
            "not a pool with a node down",
            cluster(3, **{"pool-1-w0": {"ready": "False"}}),
            frozenset(),
            ["pool-2"],
        ),
        (
            "not a pool with host maintenance due within the run",
            cluster(
                3,
                **{
                    "pool-1-w1": {
                        "node_labels": {
                            labels.SCHEDULED_MAINTENANCE_LABEL: str(int(at(600).timestamp()))
                        }
                    }
                },
            ),
            frozenset(),
            ["pool-2"],
        ),
        ("none when no pool is free", cluster(3), frozenset({"pool-1", "pool-2"}), []),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_spare_is_taken_only_from_free_usable_pools(
    case: str, nodes: list[dict[str, Any]], busy: frozenset[str], want: list[str]
) -> None:
    result = plan(seen(spare_job(), nodes=nodes, busy=busy), now=at(20))
    assert sorted(set(created_spares(result).values())) == want
    assert [p for p, _ in held(result)] == want


def test_a_spare_is_ready_once_every_idle_pod_runs_and_nothing_more_is_made() -> None:
    job = spare_job()
    running = [idle(job, "pool-1", 0), idle(job, "pool-1", 1)]
    result = plan(seen(job, running), now=at(20))
    assert created_spares(result) == {}
    assert result.delete_pods == ()
    assert held(result) == [("pool-1", True)]
    starting = [idle(job, "pool-1", 0), idle(job, "pool-1", 1, phase="Pending")]
    assert held(plan(seen(job, starting), now=at(20))) == [("pool-1", False)]


def test_a_lost_node_moves_the_slice_to_the_spare_first_and_the_spare_is_let_go() -> None:
    # pool-1 is free and first by name; pool-2 is the job's spare and wins.
    job = spare_job(spares=[{"nodePool": "pool-2", "ready": True}])
    nodes = cluster(3, **{"pool-0-w1": {"ready": "Unknown", "taints": (labels.UNREACHABLE_TAINT,)}})
    spares = [idle(job, "pool-2", 0), idle(job, "pool-2", 1)]
    result = plan(seen(job, spares, nodes=nodes), now=at(20))
    assert result.status.restarts.hard == 1
    assert [p.node_pool for p in result.status.current_attempt.placement] == ["pool-2"]
    assert {(d.name, d.grace_seconds) for d in result.delete_pods} >= {
        (spare_pod_name("train", "pool-2", w), 0) for w in (0, 1)
    }
    assert held(result) == []
    assert TimelineKind.SPARE_USED in kinds(result)
    # Not refilled while the job recovers: a launch never loses a pool to a spare.
    assert created_spares(result) == {}
    assert result.status.phase is Phase.RECOVERING


def test_a_spare_whose_node_went_down_is_let_go_and_another_pool_taken() -> None:
    job = spare_job(spares=[{"nodePool": "pool-1", "ready": True}])
    nodes = cluster(3, **{"pool-1-w0": {"ready": "False"}})
    spares = [idle(job, "pool-1", 0), idle(job, "pool-1", 1)]
    result = plan(seen(job, spares, nodes=nodes), now=at(20))
    assert sorted(d.name for d in result.delete_pods) == sorted(
        p["metadata"]["name"] for p in spares
    )
    assert set(created_spares(result).values()) == {"pool-2"}
    assert held(result) == [("pool-2", False)]
    assert TimelineKind.SPARE_RELEASED in kinds(result)


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("the job succeeded", {"status": {"phase": "Succeeded"}}),
        ("the job is suspended", {"spec": {"suspend": True}}),
        ("spares lowered to zero", {"spec": {"tpu": {"spares": 0}}}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_spares_are_let_go(case: str, change: dict[str, dict[str, Any]]) -> None:
    job = spare_job(spares=[{"nodePool": "pool-1", "ready": True}])
    spares = [idle(job, "pool-1", 0), idle(job, "pool-1", 1)]
    for part, fields in change.items():
        for key, value in fields.items():
            target = job[part]
            if isinstance(value, dict):
                target[key].update(value)
            else:
                target[key] = value
    result = plan(seen(job, spares), now=at(20))
    assert sorted(d.name for d in result.delete_pods if "spare" in d.name) == sorted(
        p["metadata"]["name"] for p in spares
    )
    assert held(result) == []
    assert created_spares(result) == {}


def test_an_idle_pod_that_ended_is_let_go_and_its_pool_taken_again_only_later() -> None:
    job = spare_job(spares=[{"nodePool": "pool-1", "ready": True}])
    spares = [idle(job, "pool-1", 0), idle(job, "pool-1", 1, phase="Failed")]
    result = plan(seen(job, spares), now=at(20))
    assert [d.name for d in result.delete_pods] == [spare_pod_name("train", "pool-1", 1)]
    assert "pool-1" not in created_spares(result).values()


def test_a_pod_labelled_a_spare_under_a_name_not_given_is_deleted_and_holds_nothing() -> None:
    job = spare_job(count=0)
    forged = idle(job, "pool-2", 0, name="train-spare-forged-0")
    result = plan(seen(job, [forged]), now=at(20))
    assert [d.name for d in result.delete_pods] == ["train-spare-forged-0"]
    assert held(result) == []


def test_two_held_spares_over_the_count_keep_one() -> None:
    job = spare_job(
        spares=[{"nodePool": "pool-1", "ready": True}, {"nodePool": "pool-2", "ready": True}]
    )
    job["spec"]["tpu"]["spares"] = 1
    spares = [idle(job, p, w) for p in ("pool-1", "pool-2") for w in (0, 1)]
    result = plan(seen(job, spares), now=at(20))
    assert len(held(result)) == 1
    assert len(result.delete_pods) == 2
