"""Only evidence the operator trusts gets a node tainted (a job's author cannot steer it).

A pod a user makes with the job's labels, failing with a termination message that claims a
hard failure, is not the job's (it has no ownerReference to it) and taints nothing. The
trainer's own report of a hard failure moves the slice but blames no node. (A node that goes
NotReady under a running worker is still tainted: `test_operator_recovery`'s node-down test.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, wait_for
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import FAULTED_STEPS, Run, training_job

from tpujob.api import contract, labels

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


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
    claim = contract.encode_termination_message(
        contract.TerminationMessage(
            code="DEVICE_COUNT_MISMATCH",
            exit_code=14,
            class_hint=contract.ClassHint.HARD,
            summary="this node's TPUs are broken",
        )
    )
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
