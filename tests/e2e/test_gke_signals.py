"""`tpujob local fault tpu-unhealthy` shows exactly what GKE shows for failed TPU chips.

The kubelet lowers allocatable google.com/tpu below capacity (the device plugin lists the
devices Unhealthy) and reports the devices Unhealthy in the pods holding them
(status.containerStatuses[].allocatedResourcesStatus, beta and on by default from v1.36).
No node condition is invented for it.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("healthy_nodes")]
TPU = "google.com/tpu"
STANDARD_CONDITIONS = {
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
}


def chip_holder(node: str, chips: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "chip-holder"},
        "spec": {
            "restartPolicy": "Never",
            "nodeName": node,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": TPU, "operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "local",
                    "command": ["sleep", "300"],
                    "resources": {"limits": {TPU: str(chips)}},
                }
            ],
        },
    }


def device_health(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    raw = core.api_client.sanitize_for_serialization(
        core.read_namespaced_pod("chip-holder", namespace)
    )
    health = {}
    for cs in raw.get("status", {}).get("containerStatuses") or []:
        for resource in cs.get("allocatedResourcesStatus") or []:
            if resource.get("name") == TPU:
                health.update(
                    {d["resourceID"]: d.get("health") for d in resource.get("resources") or []}
                )
    return health


def test_tpu_unhealthy_shows_only_real_gke_signals(
    cluster: LocalCluster, core: client.CoreV1Api, namespace: str
) -> None:
    node = "tpu-pool-2-w1"
    chips = int(core.read_node(node).status.capacity[TPU])
    core.create_namespaced_pod(namespace, chip_holder(node, chips))
    wait_for(
        lambda: set(device_health(core, namespace).values()) == {"Healthy"},
        timeout=60,
        what="the pod's TPU devices reported Healthy",
    )
    assert len(device_health(core, namespace)) == chips

    cluster.tpujob("local", "fault", "tpu-unhealthy", node)
    wait_for(
        lambda: core.read_node(node).status.allocatable[TPU] == "0",
        timeout=30,
        what="allocatable google.com/tpu 0",
    )
    wait_for(
        lambda: set(device_health(core, namespace).values()) == {"Unhealthy"},
        timeout=30,
        what="the pod's TPU devices reported Unhealthy",
    )
    status = core.read_node(node).status
    assert status.capacity[TPU] == str(chips)
    assert {c.type for c in status.conditions} <= STANDARD_CONDITIONS
    assert next(c.status for c in status.conditions if c.type == "Ready") == "True"

    cluster.tpujob("local", "fault", "tpu-healthy", node)
    wait_for(
        lambda: core.read_node(node).status.allocatable[TPU] == str(chips),
        timeout=30,
        what="allocatable restored",
    )
    wait_for(
        lambda: set(device_health(core, namespace).values()) == {"Healthy"},
        timeout=30,
        what="the pod's TPU devices Healthy again",
    )
