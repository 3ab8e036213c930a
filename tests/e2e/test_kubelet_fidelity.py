"""The local cluster's node agent does what a real kubelet did on kind, where the two differed
(hack/kubelet-fidelity.py measures both; docs/kubelet-fidelity.md has the figures)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, wait_for
from tests.e2e.test_local_cluster import phase_of, pod_manifest

pytestmark = pytest.mark.cluster


def test_a_claim_on_a_directory_or_create_volume_gets_its_folder_made(
    core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    # The agent used to fail this pod with "is not a directory"; the kubelet makes the folder.
    folder = tmp_path / "not-yet" / "checkpoints"
    pv = f"{namespace}-ckpt"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"},
                "claimRef": {"namespace": namespace, "name": "ckpt"},
            },
        }
    )
    try:
        core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "metadata": {"name": "ckpt"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Mi"}},
                },
            },
        )
        core.create_namespaced_pod(
            namespace,
            pod_manifest(
                "writer",
                ["sh", "-c", "echo ok > /ckpt/file"],
                container={"volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]},
                volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            ),
        )
        wait_for(
            lambda: phase_of(core, namespace, "writer") in ("Succeeded", "Failed"),
            timeout=60,
            what="writer finished",
        )
        pod = core.read_namespaced_pod("writer", namespace)
        assert pod.status.phase == "Succeeded", pod.status
        assert (folder / "file").read_text() == "ok\n"
    finally:
        core.delete_persistent_volume(pv)


def _status(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    pod = core.read_namespaced_pod(name, namespace)
    return dict(core.api_client.sanitize_for_serialization(pod)["status"])


def test_a_killed_container_reads_as_the_kubelet_reports_it(
    cluster: LocalCluster, core: client.CoreV1Api, namespace: str
) -> None:
    name = f"victim-{uuid.uuid4().hex[:4]}"
    core.create_namespaced_pod(namespace, pod_manifest(name, ["sleep", "300"]))
    wait_for(lambda: phase_of(core, namespace, name) == "Running", timeout=60, what="Running")
    assert {c["type"]: c["status"] for c in _status(core, namespace, name)["conditions"]} == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
        "PodScheduled": "True",
    }
    cluster.tpujob("local", "fault", "kill", name, "-n", namespace)
    wait_for(lambda: phase_of(core, namespace, name) == "Failed", timeout=30, what="Failed")
    status = _status(core, namespace, name)
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    # As on kind: exit 137, reason Error, no message, and no `signal` field.
    assert (terminated["exitCode"], terminated["reason"]) == (137, "Error")
    assert "signal" not in terminated
    assert "message" not in terminated
    reasons = {c["type"]: c.get("reason") for c in status["conditions"]}
    assert reasons["Ready"] == reasons["ContainersReady"] == "PodFailed"
