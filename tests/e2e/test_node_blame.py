"""Only evidence the operator trusts gets a node tainted (a job's author cannot steer it).

A pod a user makes with the job's labels, failing with a termination message that claims a
hard failure, is not the job's (it has no ownerReference to it) and taints nothing. The
trainer's own report of a hard failure moves the slice but blames no node. (A node that goes
NotReady under a running worker is still tainted: `test_operator_recovery`'s node-down test.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, delete_namespace, wait_for
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import FAULTED_STEPS, Run, timeline_kinds, training_job

from tpujob.api import GROUP, PLURAL, VERSION, contract, labels

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


# Exit 14 is the trainer's "fewer accelerator devices than requested": hard by its own word.
HARD_CLAIM = contract.encode_termination_message(
    contract.TerminationMessage(
        code="DEVICE_COUNT_MISMATCH",
        exit_code=14,
        class_hint=contract.ClassHint.HARD,
        summary="this node's TPUs are broken",
    )
)


def tpujob_taints(core: client.CoreV1Api) -> dict[str, str]:
    return {
        n.metadata.name: t.value
        for n in core.list_node().items
        for t in n.spec.taints or []
        if t.key == labels.BAD_NODE_TAINT
    }


def test_a_forged_worker_pod_and_a_self_reported_hard_failure_taint_no_node(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    before = tpujob_taints(core)
    # Exit 14 is the trainer's "fewer accelerator devices than requested": hard by its own word.
    run = Run(
        cluster,
        namespace,
        operator,
        training_job(
            "blame", tmp_path, steps=FAULTED_STEPS, faults=("exit-code=14@20:worker=1:attempt=1",)
        ),
    )
    run.wait_training(step=5)
    claim = HARD_CLAIM
    core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "blame-1-0-1-forged",
                "labels": {
                    labels.JOB: "blame",
                    labels.ATTEMPT: "1",
                    labels.SLICE: "0",
                    labels.WORKER: "1",
                },
            },
            "spec": {
                "restartPolicy": "Never",
                "nodeName": "cpu-pool-w0",
                "containers": [
                    {
                        "name": "trainer",
                        "image": "local",
                        "command": [
                            "sh",
                            "-c",
                            f"echo {json.dumps(claim)!r} >/dev/termination-log; exit 14",
                        ],
                    }
                ],
            },
        },
    )
    wait_for(
        lambda: core.read_namespaced_pod("blame-1-0-1-forged", namespace).status.phase == "Failed",
        timeout=60,
        what="the forged pod failed",
    )
    status = run.wait_phase("Succeeded")
    assert status["restarts"]["hard"] == 1, status.get("timeline")
    assert status["lastFailure"]["pod"] == "blame-1-0-1"  # the real worker, not the forged one
    assert status.get("failedNodes", []) == []
    placements = [e["message"] for e in status["timeline"] if e["kind"] == "PodsCreated"]
    assert (
        len(placements) == 2 and placements[0].split(" on ")[-1] != placements[1].split(" on ")[-1]
    ), placements
    assert tpujob_taints(core) == before


def _create_namespace(core: client.CoreV1Api, name: str) -> str:
    core.create_namespace({"metadata": {"name": name}})
    return name


def _tenant_job(run_ns: str, custom: client.CustomObjectsApi, tmp_path: Path) -> dict[str, Any]:
    """A job of a shape no pool has: it waits for a pool, holds none, and gives the tenant a
    uid to forge owner references with."""
    body = training_job("evil", tmp_path / run_ns, steps=10)
    body["spec"]["tpu"]["topology"] = "4x4x4"
    return dict(custom.create_namespaced_custom_object(GROUP, VERSION, run_ns, PLURAL, body))


def _forged_pod(job: dict[str, Any], node: str, claim: str) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "evil-1-0-0",
            "labels": {
                labels.JOB: "evil",
                labels.ATTEMPT: "1",
                labels.SLICE: "0",
                labels.WORKER: "0",
            },
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "TPUTrainingJob",
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ],
        },
        "spec": {
            "restartPolicy": "Never",
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "local",
                    "command": ["sh", "-c", f"echo {claim!r} >/dev/termination-log; exit 14"],
                }
            ],
        },
    }


def test_hostile_tenants_neither_delay_another_tenants_job_nor_taint_a_node(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    """Two tenant namespaces do what a label or an owner reference lets anyone do: pods that
    name a job and select every pool without asking for a chip (squatting), pods owned by
    their own job but bound by `nodeName` to a TPU node and failing with a hard self-report,
    in both namespaces (which the node ledger would count as two tenants' blames), and a
    labelled Lease full of annotations. Another tenant's job starts at once, trains to the end
    without a restart, and no node is tainted."""
    before = tpujob_taints(core)
    custom = client.CustomObjectsApi(cluster.api_client())
    tenants = [namespace, _create_namespace(core, f"{namespace[:50]}-b")]
    victim_ns = _create_namespace(core, f"{namespace[:50]}-v")
    try:
        pools = sorted(
            {
                n.metadata.labels[labels.NODEPOOL]
                for n in core.list_node().items
                if labels.ACCELERATOR in (n.metadata.labels or {})
            }
        )
        target = next(
            n.metadata.name
            for n in core.list_node().items
            if (n.metadata.labels or {}).get(labels.NODEPOOL) == pools[0]
        )
        claim = HARD_CLAIM
        for tenant in tenants:
            job = _tenant_job(tenant, custom, tmp_path)
            core.create_namespaced_pod(tenant, _forged_pod(job, target, claim))
            for i, pool in enumerate(pools):
                core.create_namespaced_pod(
                    tenant,
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": f"squat-{i}", "labels": {labels.JOB: "squat"}},
                        "spec": {
                            "nodeSelector": {labels.NODEPOOL: pool},
                            "containers": [
                                {"name": "s", "image": "local", "command": ["sleep", "600"]}
                            ],
                        },
                    },
                )
            client.CoordinationV1Api(cluster.api_client()).create_namespaced_lease(
                tenant,
                {
                    "metadata": {
                        "name": "evil-heartbeat",
                        "labels": {labels.JOB: "evil"},
                        "annotations": {"padding.example/junk": "x" * 200_000},
                    },
                    "spec": {"holderIdentity": "evil"},
                },
            )
        wait_for(
            lambda: all(
                core.read_namespaced_pod("evil-1-0-0", t).status.phase == "Failed" for t in tenants
            ),
            timeout=60,
            what="the forged pods failed on their node",
        )
        run = Run(cluster, victim_ns, operator, training_job("victim", tmp_path / "v", steps=60))
        status = run.wait_phase("Succeeded")
        assert status["restarts"]["total"] == 0, status.get("timeline")
        assert timeline_kinds(status)[:2] == ["Started", "PodsCreated"], status.get("timeline")
        for tenant in tenants:
            evil = custom.get_namespaced_custom_object(GROUP, VERSION, tenant, PLURAL, "evil")
            assert not (evil.get("status") or {}).get("lastFailure"), evil.get("status")
        assert tpujob_taints(core) == before
    finally:
        for extra in (tenants[1], victim_ns):
            delete_namespace(core, extra)
