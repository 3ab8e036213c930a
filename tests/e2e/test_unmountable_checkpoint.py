"""A job whose pods cannot start says why, and trains once they can, on the local cluster.

The checkpoint claim is bound to a hostPath volume of type Directory whose folder does not
exist yet: as on a real kubelet, the pods wait in ContainerCreating with a FailedMount event
and never fail by themselves. The operator names the waiting pod in the job's Running
condition once it has waited its grace, fails nothing, and the job trains to the end once the
folder exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_kubelet_fidelity import _claim
from tests.e2e.test_operator_recovery import Run, training_job

from tpujob.plan.starting import NOT_STARTED_GRACE_SECONDS

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


def _running(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or () if c["type"] == "Running"), {})


def test_a_job_whose_checkpoint_volume_cannot_mount_says_so_and_trains_once_it_can(
    cluster: LocalCluster,
    namespace: str,
    operator: OperatorProcess,
    core: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    folder = tmp_path / "made-later"
    pv = _claim(core, namespace, {"path": str(folder), "type": "Directory"})
    try:
        body = training_job("mount", tmp_path / "unused", steps=20)
        body["spec"]["checkpoint"]["volume"] = {"claimName": "ckpt", "mountPath": "/checkpoints"}
        run = Run(cluster, namespace, operator, body)
        said = run.wait(
            lambda s: _running(s).get("reason") == "NotStarted",
            "the Running condition naming a pod that has not started",
            timeout=NOT_STARTED_GRACE_SECONDS + 90,
        )
        message = _running(said)["message"]
        assert message.startswith("pod mount-1-0-"), message
        assert "ContainerCreating" in message and "FailedMount" in message, message
        assert said["phase"] != "Failed" and said.get("attempt") == 1
        assert not said.get("lastFailure"), said.get("lastFailure")
        folder.mkdir()
        done = run.wait_phase("Succeeded")
        assert done["attempt"] == 1  # waiting for a volume was never a failure
        assert sorted(p.name for p in folder.iterdir())  # the checkpoints are there
    finally:
        core.delete_persistent_volume(pv)
