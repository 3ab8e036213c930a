"""`tpujob doctor`'s findings from snapshots of a cluster, each with what to do."""

from __future__ import annotations

from typing import Any

import pytest

from tpujob.api import labels
from tpujob.doctor.checks import Check, Level, Snapshot, examine, exit_status
from tpujob.gcp.catalogue import Catalogue, Offer

CRD = {"spec": {"versions": [{"name": "v1alpha1", "served": True, "storage": True}]}}
READY_OPERATOR = {
    "metadata": {"name": "op-1", "namespace": "tpujob-system"},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}
CRASHING_OPERATOR = {
    "metadata": {"name": "op-2", "namespace": "tpujob-system"},
    "status": {"phase": "Pending"},
}


def tpu_node(
    name: str, pool: str, *, ready: str = "True", topo: str = "4x4", tainted: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {
            labels.NODEPOOL: pool,
            labels.ACCELERATOR: "tpu-v5-lite-podslice",
            labels.TOPOLOGY: topo,
        },
    }
    taints = []
    if tainted is not None:
        meta["annotations"] = {labels.BAD_NODE_REASON: tainted}
        taints.append({"key": labels.BAD_NODE_TAINT, "effect": "NoSchedule"})
    return {
        "metadata": meta,
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def pool(name: str, hosts: int = 4, **kw: Any) -> list[dict[str, Any]]:
    return [tpu_node(f"{name}-w{h}", name, **kw) for h in range(hosts)]


def healthy(**changes: Any) -> Snapshot:
    base: dict[str, Any] = {
        "crd": CRD,
        "operator_pods": [READY_OPERATOR],
        "nodes": pool("tpu-a"),
        "namespaces": [{"metadata": {"name": "team"}}],
        "jobs": [
            {
                "metadata": {"name": "j", "namespace": "team"},
                "spec": {"tpu": {"accelerator": "tpu-v5-lite-podslice", "topology": "4x4"}},
            }
        ],
    }
    return Snapshot(**{**base, **changes})


def levels(snap: Snapshot, check: Check) -> list[tuple[str, Level]]:
    return [(f.subject, f.level) for f in examine(snap) if f.check is check]


@pytest.mark.parametrize(
    ("case", "snap", "check", "expected"),
    [
        ("healthy crd", healthy(), Check.CRD, [("tputrainingjobs.tpujob.dev", Level.OK)]),
        ("no crd", healthy(crd=None), Check.CRD, [("tputrainingjobs.tpujob.dev", Level.PROBLEM)]),
        (
            "our version not served",
            healthy(crd={"spec": {"versions": [{"name": "v1", "served": True}]}}),
            Check.CRD,
            [("tputrainingjobs.tpujob.dev", Level.PROBLEM)],
        ),
        (
            "no operator",
            healthy(operator_pods=[]),
            Check.OPERATOR,
            [("tpujob-operator", Level.PROBLEM)],
        ),
        (
            "operator not ready",
            healthy(operator_pods=[CRASHING_OPERATOR]),
            Check.OPERATOR,
            [("tpujob-system/op-2", Level.PROBLEM)],
        ),
        (
            "a standby not ready beside a ready one",
            healthy(operator_pods=[READY_OPERATOR, CRASHING_OPERATOR]),
            Check.OPERATOR,
            [("tpujob-system/op-1", Level.OK), ("tpujob-system/op-2", Level.WARNING)],
        ),
        ("complete pool", healthy(), Check.NODE_POOLS, [("tpu-a", Level.OK)]),
        (
            "pool missing a host",
            healthy(nodes=pool("tpu-a", hosts=3)),
            Check.NODE_POOLS,
            [("tpu-a", Level.WARNING)],
        ),
        (
            "pool with a NotReady host",
            healthy(nodes=[*pool("tpu-a")[:3], tpu_node("tpu-a-w3", "tpu-a", ready="False")]),
            Check.NODE_POOLS,
            [("tpu-a", Level.WARNING)],
        ),
        (
            "node tainted by tpujob",
            healthy(
                nodes=[
                    *pool("tpu-a")[:3],
                    tpu_node("tpu-a-w3", "tpu-a", tainted="team/j: NODE_LOST"),
                ]
            ),
            Check.NODE_POOLS,
            [("tpu-a", Level.OK), ("tpu-a-w3", Level.WARNING)],
        ),
        (
            "unknown topology label",
            healthy(nodes=pool("tpu-a", topo="3x3")),
            Check.NODE_POOLS,
            [("tpu-a", Level.WARNING)],
        ),
        ("no tpu pools", healthy(nodes=[]), Check.NODE_POOLS, [("cluster", Level.WARNING)]),
        (
            "restricted namespace",
            healthy(
                namespaces=[
                    {
                        "metadata": {
                            "name": "team",
                            "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                        }
                    }
                ]
            ),
            Check.POD_SECURITY,
            [("team", Level.WARNING)],
        ),
        (
            "refused read",
            healthy(unreadable={Check.NODE_POOLS: "HTTP 403 Forbidden"}),
            Check.NODE_POOLS,
            [("node-pools", Level.PROBLEM)],
        ),
    ],
)
def test_findings(
    case: str, snap: Snapshot, check: Check, expected: list[tuple[str, Level]]
) -> None:
    assert levels(snap, check) == expected, case


def test_busy_and_free_pools_are_told_apart() -> None:
    snap = healthy(
        nodes=pool("tpu-a") + pool("tpu-b"),
        tpu_pods=[{"spec": {"nodeName": "tpu-b-w0"}, "status": {"phase": "Running"}}],
    )
    messages = {f.subject: f.message for f in examine(snap) if f.check is Check.NODE_POOLS}
    assert messages["tpu-a"].endswith("free")
    assert "busy (1 nodes run TPU pods)" in messages["tpu-b"]
    assert "v5litepod-16" in messages["tpu-a"]


def test_taint_finding_says_why_and_how_to_lift_it() -> None:
    snap = healthy(nodes=[tpu_node("n", "p", tainted="team/j: TPU_UNHEALTHY")])
    finding = next(f for f in examine(snap) if f.subject == "n")
    assert "team/j: TPU_UNHEALTHY" in finding.message
    assert finding.action.endswith(f"kubectl taint nodes n {labels.BAD_NODE_TAINT}-")


@pytest.mark.parametrize(
    ("offers", "level"),
    [
        ({"us-west4-a": (Offer("v5litepod-16", frozenset({("V5LITE_POD", "4x4")})),)}, Level.OK),
        ({"us-west4-a": (Offer("v6e-16", frozenset({("V6E", "4x4")})),)}, Level.WARNING),
    ],
)
def test_catalogue_check_of_jobs_and_pools(
    offers: dict[str, tuple[Offer, ...]], level: Level
) -> None:
    snap = healthy(catalogue=Catalogue(project="p", offers=offers))
    found = [f for f in examine(snap) if f.check is Check.CATALOGUE]
    assert [(f.subject, f.level) for f in found] == [("job team/j, pool tpu-a", level)]


@pytest.mark.parametrize(
    ("snap", "status"),
    [
        (healthy(), 0),
        (healthy(nodes=pool("tpu-a", hosts=3)), 0),  # warnings do not fail
        (healthy(crd=None, operator_pods=[]), 1),
    ],
)
def test_exit_status_is_non_zero_only_on_problems(snap: Snapshot, status: int) -> None:
    assert exit_status(examine(snap)) == status


def test_malformed_objects_are_findings_not_crashes() -> None:
    snap = healthy(
        crd={"spec": {"versions": "nope"}},
        operator_pods=[{"status": None}],
        nodes=[{"metadata": {"labels": {labels.ACCELERATOR: "x"}}, "spec": None}],
        namespaces=[{}],
    )
    assert exit_status(examine(snap)) == 1


@pytest.mark.parametrize(
    ("offers", "warned"),
    [
        ({"us-west4-a": (Offer("v6e-16", frozenset({("V6E", "4x4")})),)}, True),
        ({"us-west4-a": (Offer("v4-16", frozenset({("V4", "2x2x2")})),)}, False),
        ({}, False),  # an unreadable catalogue warns of nothing
    ],
)
def test_describe_warns_when_no_zone_offers_the_jobs_shape(
    offers: dict[str, tuple[Offer, ...]], warned: bool
) -> None:
    from tests.unit.builders import T0, job_body

    from tpujob.api import parse_job
    from tpujob.console import describe_lines

    lines = describe_lines(parse_job(job_body()), T0, Catalogue(project="p", offers=offers))
    assert any("offered in none of the zones us-west4-a" in line for line in lines) is warned


def waiting_operator(reason: str, message: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "op-3", "namespace": "tpujob-system"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "operator", "state": {"waiting": {"reason": reason, "message": message}}}
            ],
        },
    }


@pytest.mark.parametrize(
    ("pod", "says", "advice"),
    [
        (
            waiting_operator("ImagePullBackOff", 'Back-off pulling image "ghcr.io/tpujob/x:0.1.0"'),
            'ImagePullBackOff (Back-off pulling image "ghcr.io/tpujob/x:0.1.0")',
            "make release REGISTRY=",
        ),
        (waiting_operator("CrashLoopBackOff", "back-off 5m0s"), "CrashLoopBackOff", "--previous"),
        (
            {
                "metadata": {"name": "op-4", "namespace": "tpujob-system"},
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "message": "0/3 nodes are available: 3 Insufficient cpu.",
                        }
                    ],
                },
            },
            "unschedulable (0/3 nodes are available: 3 Insufficient cpu.)",
            "describe pod",
        ),
    ],
    ids=["image-pull", "crash-loop", "unschedulable"],
)
def test_an_operator_pod_that_is_not_ready_says_why_and_what_to_do(
    pod: dict[str, Any], says: str, advice: str
) -> None:
    (finding,) = [f for f in examine(healthy(operator_pods=[pod])) if f.check is Check.OPERATOR]
    assert finding.level is Level.PROBLEM
    assert says in finding.message, finding.message
    assert advice in (finding.action or ""), finding.action


def queued(name: str, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "labels": {labels.QUEUE_NAME: "q"}},
        "status": status,
    }


@pytest.mark.parametrize(
    ("status", "level", "said"),
    [
        (
            {"queue": {"name": "q", "admitted": True, "clusterQueue": "cq"}},
            Level.OK,
            "by ClusterQueue cq",
        ),
        (
            {
                "queue": {
                    "name": "q",
                    "waitingSince": "2026-01-01T12:00:00Z",
                    "evictions": 2,
                    "lastEviction": "evicted by Kueue (Preempted)",
                }
            },
            Level.INFO,
            "waiting for admission since 2026-01-01T12:00:00Z; evicted 2x",
        ),
        (
            {
                "conditions": [
                    {
                        "type": "Suspended",
                        "status": "True",
                        "reason": "WaitingForAdmission",
                        "message": "names Kueue queue q, but ... (tpujob operator --kueue; ...)",
                    }
                ]
            },
            Level.WARNING,
            "runs without its Kueue integration",
        ),
        ({"phase": "Succeeded", "queue": {"name": "q"}}, None, None),
    ],
    ids=["admitted", "waiting-after-preemptions", "integration-off", "finished"],
)
def test_the_queue_of_each_job_naming_one(
    status: dict[str, Any], level: Level | None, said: str | None
) -> None:
    found = [
        f
        for f in examine(Snapshot(crd=CRD, jobs=[queued("j", status), {"metadata": {}}]))
        if f.check is Check.QUEUES
    ]
    if level is None:
        assert found == []
        return
    (finding,) = found
    assert finding.level is level and finding.subject == "job team/j"
    assert said is not None and said in finding.message
