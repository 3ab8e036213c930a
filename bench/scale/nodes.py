"""Fake GKE TPU node pools for kwok: one pool per slice, one Node per TPU VM, labelled as GKE does.

kwok (`manageNodesWithLabelSelector: kwok.x-k8s.io/node=fake`) posts their status and renews
their Leases; relabelling a node `kwok.x-k8s.io/node=lost` drops it from kwok's watch, which is
how a node is lost (a dead kubelet).
"""

from __future__ import annotations

import math
from typing import Any

POOL_PREFIX = "kwok-tpu"
MANAGED = "kwok.x-k8s.io/node"

# accelerator label -> (machine type of a 4-chip VM, vCPU, memory of that VM)
MACHINES = {
    "tpu-v4-podslice": ("ct4p-hightpu-4t", "240", "407Gi"),
    "tpu-v5-lite-podslice": ("ct5lp-hightpu-4t", "112", "192Gi"),
    "tpu-v5p-slice": ("ct5p-hightpu-4t", "208", "448Gi"),
    "tpu-v6e-slice": ("ct6e-standard-4t", "180", "720Gi"),
}


def slice_shape(topology: str) -> tuple[int, int]:
    """(VMs per slice, chips per VM) of a topology; single-host shapes are one VM."""
    chips = math.prod(int(d) for d in topology.split("x"))
    if chips <= 4:
        return 1, chips
    if topology == "2x4":
        return 1, 8
    return chips // 4, 4


def pool_name(index: int) -> str:
    return f"{POOL_PREFIX}-{index:04d}"


def pool_of(node_name: str) -> str:
    """The pool of a node named `<pool>-w<host>`."""
    return node_name.rsplit("-w", 1)[0]


def node(name: str, pool: str, accelerator: str, topology: str, chips: int) -> dict[str, Any]:
    machine, cpu, memory = MACHINES.get(accelerator, ("ct-unknown-4t", "112", "192Gi"))
    resources = {
        "cpu": cpu,
        "memory": memory,
        "pods": "110",
        "ephemeral-storage": "100Gi",
        "google.com/tpu": str(chips),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                MANAGED: "fake",
                "type": "kwok",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": machine,
                "cloud.google.com/gke-nodepool": pool,
                "cloud.google.com/gke-tpu-accelerator": accelerator,
                "cloud.google.com/gke-tpu-topology": topology,
                "cloud.google.com/gke-accelerator-count": str(chips),
            },
        },
        "spec": {
            "providerID": f"kwok://{name}",
            "taints": [{"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            # Every field: kubectl's validation and the Python client's models require them.
            "nodeInfo": {
                "kubeletVersion": "v1.36.3",
                "architecture": "amd64",
                "operatingSystem": "linux",
                "machineID": name,
                "systemUUID": name,
                "bootID": name,
                "kernelVersion": "kwok",
                "osImage": "kwok GKE TPU VM",
                "containerRuntimeVersion": "kwok://v0.8.0",
                "kubeProxyVersion": "",
            },
        },
    }


def pools(count: int, accelerator: str, topology: str) -> list[dict[str, Any]]:
    """The Nodes of `count` pools, each one slice of `topology`."""
    hosts, chips = slice_shape(topology)
    return [
        node(f"{pool_name(i)}-w{h}", pool_name(i), accelerator, topology, chips)
        for i in range(count)
        for h in range(hosts)
    ]
