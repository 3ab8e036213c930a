"""The local cluster's node agent does what a real kubelet did on kind, where the two differed
(hack/kubelet-fidelity.py measures both; docs/kubelet-fidelity.md has the figures)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, wait_for
from tests.e2e.test_local_cluster import phase_of, pod_manifest

pytestmark = pytest.mark.cluster


def _claim(core: client.CoreV1Api, namespace: str, host_path: dict[str, str]) -> str:
    """A claim `ckpt` bound to a new hostPath PersistentVolume; returns the volume's name."""
    pv = f"{namespace}-ckpt"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "hostPath": host_path,
                "claimRef": {"namespace": namespace, "name": "ckpt"},
            },
        }
    )
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
    return pv


WRITER_MOUNTS = {"volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}]}
WRITER_VOLUMES = [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}]


def _finished(core: client.CoreV1Api, namespace: str, name: str) -> bool:
    return phase_of(core, namespace, name) in ("Succeeded", "Failed")


def test_a_claim_on_a_directory_or_create_volume_gets_its_folder_made(
    core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    # The agent used to fail this pod with "is not a directory"; the kubelet makes the folder.
    folder = tmp_path / "not-yet" / "checkpoints"
    pv = _claim(core, namespace, {"path": str(folder), "type": "DirectoryOrCreate"})
    try:
        core.create_namespaced_pod(
            namespace,
            pod_manifest(
                "writer",
                ["sh", "-c", "echo ok > /ckpt/file"],
                container=WRITER_MOUNTS,
                volumes=WRITER_VOLUMES,
            ),
        )
        wait_for(lambda: _finished(core, namespace, "writer"), timeout=60, what="finished")
        assert phase_of(core, namespace, "writer") == "Succeeded"
        assert (folder / "file").read_text() == "ok\n"
    finally:
        core.delete_persistent_volume(pv)


def test_a_volume_that_cannot_mount_yet_waits_and_is_tried_again(
    core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    # As on kind: Pending in ContainerCreating with a FailedMount event, not a failed pod;
    # the pod starts once the folder is there.
    folder = tmp_path / "made-later"
    pv = _claim(core, namespace, {"path": str(folder), "type": "Directory"})
    try:
        core.create_namespaced_pod(
            namespace,
            pod_manifest(
                "waiter",
                ["sh", "-c", "echo ok > /ckpt/file"],
                container=WRITER_MOUNTS,
                volumes=WRITER_VOLUMES,
            ),
        )

        def failed_mount() -> list[str]:
            events = core.list_namespaced_event(
                namespace, field_selector="involvedObject.name=waiter"
            ).items
            return [e.message for e in events if e.reason == "FailedMount"]

        messages = wait_for(failed_mount, timeout=60, what="a FailedMount event")
        assert f"hostPath type check failed: {folder} is not a directory" in messages[0]

        def waiting() -> str | None:
            statuses = core.read_namespaced_pod("waiter", namespace).status.container_statuses
            state = statuses[0].state if statuses else None
            return state.waiting.reason if state and state.waiting else None

        # The event may come a moment before the status that says the same.
        assert wait_for(waiting, timeout=30, what="waiting") == "ContainerCreating"
        assert phase_of(core, namespace, "waiter") == "Pending"
        folder.mkdir()
        wait_for(lambda: _finished(core, namespace, "waiter"), timeout=60, what="finished")
        assert phase_of(core, namespace, "waiter") == "Succeeded"
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


def test_a_force_deleted_pod_gets_sigterm_then_sigkill_two_seconds_later(
    core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    # As the kubelet does (its minimum grace period), where the agent used to SIGKILL at once.
    out = tmp_path / "signals"
    script = (
        f"trap 'date +%s.%N >> {out}/term' TERM; "
        f"while true; do date +%s.%N > {out}/alive; sleep 0.1; done"
    )
    out.mkdir()
    core.create_namespaced_pod(
        namespace,
        pod_manifest(
            "forced",
            ["sh", "-c", script],
            terminationGracePeriodSeconds=30,
            container={"volumeMounts": [{"name": "out", "mountPath": str(out)}]},
            volumes=[{"name": "out", "hostPath": {"path": str(out)}}],
        ),
    )
    wait_for(lambda: phase_of(core, namespace, "forced") == "Running", timeout=60, what="Running")
    wait_for((out / "alive").exists, timeout=30, what="the loop running")
    start = time.time()
    core.delete_namespaced_pod("forced", namespace, grace_period_seconds=0)
    wait_for((out / "term").exists, timeout=10, what="SIGTERM")
    time.sleep(4)
    last_alive = float((out / "alive").read_text())
    assert 1.0 < last_alive - start < 3.5, last_alive - start


def test_a_container_lost_when_its_node_restarts_reads_exit_255_unknown(
    cluster: LocalCluster, core: client.CoreV1Api, namespace: str
) -> None:
    node = "tpu-pool-2-w0"
    kept = {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 3600}
    core.create_namespaced_pod(
        namespace,
        pod_manifest(
            "survivor",
            ["sleep", "300"],
            nodeName=node,
            tolerations=[
                {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
                {**kept, "key": "node.kubernetes.io/unreachable"},
                {**kept, "key": "node.kubernetes.io/not-ready"},
            ],
        ),
    )
    wait_for(lambda: phase_of(core, namespace, "survivor") == "Running", timeout=60, what="Running")
    cluster.tpujob("local", "fault", "node-down", node)
    try:
        time.sleep(3)
    finally:
        cluster.tpujob("local", "fault", "node-up", node)
    wait_for(lambda: _finished(core, namespace, "survivor"), timeout=60, what="finished")
    terminated = _status(core, namespace, "survivor")["containerStatuses"][0]["state"]
    assert terminated["terminated"]["exitCode"] == 255
    assert terminated["terminated"]["reason"] == "Unknown"
    assert "message" not in terminated["terminated"]
