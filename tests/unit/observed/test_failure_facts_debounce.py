"""Node trouble is a failure only once it has lasted its grace; a pod's own failed chips at once."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from tests.unit.builders import at, cluster, iso, job_body, observed, pod, running_status

from tpujob.api import Phase, labels
from tpujob.observed.nodes import NodeHealthSettings, NodeTrouble, judge, note_tpu_shortfall
from tpujob.observed.trouble import find_trouble
from tpujob.observed.views import NodeView, node_view
from tpujob.plan.planner import plan

GRACE = NodeHealthSettings(not_ready_grace_seconds=40, tpu_shortfall_grace_seconds=60)


def raw_node(
    *,
    ready: str = "True",
    since: float | None = 0.0,
    allocatable: int = 4,
    taints: tuple[tuple[str, str], ...] = (),
    node_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": "Ready", "status": ready}
    if since is not None:
        condition["lastTransitionTime"] = iso(at(since))
    return {
        "metadata": {"name": "n0", "labels": {labels.NODEPOOL: "pool-0", **(node_labels or {})}},
        "spec": {"taints": [{"key": k, "effect": e} for k, e in taints]},
        "status": {
            "conditions": [condition],
            "capacity": {labels.TPU_RESOURCE: "4"},
            "allocatable": {labels.TPU_RESOURCE: str(allocatable)},
        },
    }


@pytest.mark.parametrize(
    ("case", "node", "now", "short_since", "expected"),
    [
        ("ready node", raw_node(), 100, {}, NodeTrouble.NONE),
        (
            "not ready for 5s is a suspect",
            raw_node(ready="False", since=95),
            100,
            {},
            NodeTrouble.SUSPECT,
        ),
        (
            "not ready past the grace is lost",
            raw_node(ready="False", since=50),
            100,
            {},
            NodeTrouble.NOT_READY,
        ),
        (
            "unknown past the grace is lost",
            raw_node(ready="Unknown", since=0),
            100,
            {},
            NodeTrouble.NOT_READY,
        ),
        (
            "not ready with no transition time counts at once",
            raw_node(ready="False", since=None),
            100,
            {},
            NodeTrouble.NOT_READY,
        ),
        (
            "unreachable NoExecute taint counts at once",
            raw_node(ready="Unknown", since=99, taints=((labels.UNREACHABLE_TAINT, "NoExecute"),)),
            100,
            {},
            NodeTrouble.UNREACHABLE,
        ),
        (
            "not-ready NoExecute taint waits like the condition",
            raw_node(ready="False", since=99, taints=((labels.NOT_READY_TAINT, "NoExecute"),)),
            100,
            {},
            NodeTrouble.SUSPECT,
        ),
        (
            "out-of-service taint counts at once",
            raw_node(taints=((labels.OUT_OF_SERVICE_TAINT, "NoExecute"),)),
            100,
            {},
            NodeTrouble.OUT_OF_SERVICE,
        ),
        (
            "maintenance taint",
            raw_node(taints=((labels.MAINTENANCE_TAINTS[0], "NoSchedule"),)),
            100,
            {},
            NodeTrouble.MAINTENANCE,
        ),
        (
            "tpu shortfall first seen now is a suspect",
            raw_node(allocatable=0),
            100,
            {},
            NodeTrouble.SUSPECT,
        ),
        (
            "tpu shortfall within the grace is a suspect",
            raw_node(allocatable=0),
            100,
            {"n0": at(50)},
            NodeTrouble.SUSPECT,
        ),
        (
            "tpu shortfall past the grace",
            raw_node(allocatable=2),
            100,
            {"n0": at(30)},
            NodeTrouble.TPU_SHORT,
        ),
        (
            "tpu shortfall with no record kept counts at once",
            raw_node(allocatable=0),
            100,
            None,
            NodeTrouble.TPU_SHORT,
        ),
    ],
)
def test_node_verdict(
    case: str,
    node: dict[str, Any],
    now: float,
    short_since: dict[str, Any] | None,
    expected: NodeTrouble,
) -> None:
    verdict = judge(node_view(node), now=at(now), settings=GRACE, tpu_short_since=short_since)
    assert verdict.trouble is expected, case
    assert (expected is NodeTrouble.NONE) == (verdict.reason == ""), case


def test_a_missing_node_is_gone() -> None:
    assert judge(None, now=at(0), name="n9").trouble is NodeTrouble.GONE


def test_shortfall_record_keeps_the_first_time_and_forgets_recovered_nodes() -> None:
    short = node_view(raw_node(allocatable=0))
    healthy = NodeView(
        name="n1",
        pool="pool-0",
        accelerator=None,
        topology=None,
        ready="True",
        tpu_capacity=4,
        tpu_allocatable=4,
    )
    first = note_tpu_shortfall(
        note_tpu_shortfall({}, "n0", short, now=at(10)), "n1", healthy, now=at(10)
    )
    assert first == {"n0": at(10)}
    assert note_tpu_shortfall(first, "n0", short, now=at(30)) == {"n0": at(10)}
    assert note_tpu_shortfall(first, "n0", node_view(raw_node()), now=at(40)) == {}


def two_workers_on(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]


def nodes_with(w0: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = cluster(3)
    nodes[0] = {**raw_node(**w0), "metadata": nodes[0]["metadata"]}
    return nodes


@pytest.mark.parametrize(
    ("case", "w0", "now", "hard"),
    [
        ("kubelet restart: Ready=False for 3s", {"ready": "False", "since": 17}, 20, False),
        ("Ready flapped back to True within the grace", {"ready": "True", "since": 18}, 20, False),
        ("NotReady past the grace", {"ready": "False", "since": 0}, 60, True),
    ],
)
def test_planner_debounces_not_ready(case: str, w0: dict[str, Any], now: float, hard: bool) -> None:
    job = job_body(status=running_status())
    result = plan(observed(job, two_workers_on(job), nodes=nodes_with(w0)), now=at(now))
    assert (result.status.restarts.hard == 1) is hard, case
    if not hard:
        assert result.status.phase is Phase.RUNNING, case
        assert result.mark_nodes == (), case


def test_a_device_plugin_restart_is_no_failure_until_the_shortfall_lasts() -> None:
    job = job_body(status=running_status())
    nodes = nodes_with({"allocatable": 0})
    pods = two_workers_on(job)
    early = observed(job, pods, nodes=nodes)
    early = replace(early, tpu_short_since={"pool-0-w0": at(15)})
    assert (
        find_trouble(
            early,
            1,
            now=at(20),
            launched_at=at(1),
            stall_timeout=600,
            startup_timeout=1800,
            last_step=None,
        )
        is None
    )
    late = find_trouble(
        early,
        1,
        now=at(15) + timedelta(seconds=61),
        launched_at=at(1),
        stall_timeout=600,
        startup_timeout=1800,
        last_step=None,
    )
    assert late is not None
    assert late.nodes == ("pool-0-w0",)


def unhealthy_pod(job: dict[str, Any]) -> dict[str, Any]:
    raw = pod(job, 1, 0, 0)
    raw["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {
            "name": labels.TPU_RESOURCE,
            "resources": [
                {"resourceID": "accel0", "health": "Healthy"},
                {"resourceID": "accel1", "health": "Unhealthy"},
            ],
        },
        {"name": "cpu", "resources": [{"resourceID": "x", "health": "Unhealthy"}]},
        "not a mapping",
    ]
    return raw


def test_the_pods_own_unhealthy_chips_are_a_hard_tpu_failure_at_once() -> None:
    job = job_body(status=running_status())
    pods = [unhealthy_pod(job), pod(job, 1, 0, 1)]
    result = plan(observed(job, pods), now=at(20))
    assert result.status.restarts.hard == 1
    assert result.status.last_failure is not None
    assert result.status.last_failure.code == "TPU_UNHEALTHY"
    assert [n.name for n in result.status.failed_nodes] == ["pool-0-w0"]
    trouble = find_trouble(
        observed(job, pods),
        1,
        now=at(20),
        launched_at=at(1),
        stall_timeout=600,
        startup_timeout=1800,
        last_step=None,
    )
    assert trouble is not None
    assert "accel1" in trouble.facts.workers[0].context
    assert "accel0" not in trouble.facts.workers[0].context


def test_unknown_device_health_is_no_evidence() -> None:
    job = job_body(status=running_status())
    raw = pod(job, 1, 0, 0)
    raw["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": labels.TPU_RESOURCE, "resources": [{"resourceID": "accel0", "health": "Unknown"}]}
    ]
    result = plan(observed(job, [raw, pod(job, 1, 0, 1)]), now=at(20))
    assert result.status.restarts.hard == 0
