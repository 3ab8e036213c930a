"""Pure description of the local cluster's nodes and the objects that represent them.

Each TPU node pool is one slice of `accelerator`/`topology`: as many nodes as the slice has
hosts, each with the chips of one host as `google.com/tpu`, labelled and tainted as GKE does.
Spare nodes are plain CPU nodes for everything that is not a TPU workload (the operator, for one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

TPU_RESOURCE = "google.com/tpu"
LABEL_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
LABEL_NODEPOOL = "cloud.google.com/gke-nodepool"
LABEL_ACCELERATOR_COUNT = "cloud.google.com/gke-accelerator-count"
LABEL_LOCAL = "tpujob.dev/local-node"
TPU_TAINT = {"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}
KUBELET_VERSION = "v1.36.3"


@dataclass(frozen=True)
class NodeSpec:
    """One node to register."""

    name: str
    pool: str
    tpu_chips: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[dict[str, str], ...] = ()
    cpu: str = "8"
    memory: str = "32Gi"
    pods: str = "110"


def slice_shape(accelerator: str, topology: str) -> tuple[int, int]:
    """(hosts, chips per host) of one slice, from the GKE TPU table."""
    from tpujob.api import topology as table

    shape = table.resolve(accelerator, topology)
    return shape.hosts, shape.chips_per_host


def plan_nodes(pools: int, accelerator: str, topology: str, spare_nodes: int) -> list[NodeSpec]:
    hosts, chips = slice_shape(accelerator, topology)
    nodes: list[NodeSpec] = []
    for p in range(pools):
        pool = f"tpu-pool-{p}"
        for h in range(hosts):
            name = f"{pool}-w{h}"
            nodes.append(
                NodeSpec(
                    name=name,
                    pool=pool,
                    tpu_chips=chips,
                    taints=(TPU_TAINT,),
                    labels={
                        LABEL_ACCELERATOR: accelerator,
                        LABEL_TOPOLOGY: topology,
                        LABEL_NODEPOOL: pool,
                        LABEL_ACCELERATOR_COUNT: str(chips),
                        "node.kubernetes.io/instance-type": _machine_type(chips),
                    },
                )
            )
    for s in range(spare_nodes):
        nodes.append(
            NodeSpec(
                name=f"cpu-pool-w{s}",
                pool="cpu-pool",
                tpu_chips=0,
                labels={LABEL_NODEPOOL: "cpu-pool"},
            )
        )
    return [_with_common_labels(n) for n in nodes]


def _machine_type(chips: int) -> str:
    return f"ct-local-hightpu-{chips}t"


def _with_common_labels(node: NodeSpec) -> NodeSpec:
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        LABEL_LOCAL: "true",
        **node.labels,
    }
    return NodeSpec(
        node.name, node.pool, node.tpu_chips, labels, node.taints, node.cpu, node.memory, node.pods
    )


def node_object(node: NodeSpec) -> dict[str, Any]:
    """The Node to create; status is posted separately, as a kubelet does."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node.name, "labels": dict(node.labels)},
        "spec": {"taints": [dict(t) for t in node.taints]},
    }


def node_status(
    node: NodeSpec,
    *,
    now: str,
    tpu_healthy: bool,
    log_port: int,
    ready_since: str,
    ready: bool = True,
) -> dict[str, Any]:
    """The node's status as its kubelet would post it at `now` (RFC 3339).

    Not `ready`: Ready=False as a kubelet posts it while its container runtime does not answer
    (its pods keep running meanwhile).

    Failed chips show as a kubelet shows them: allocatable google.com/tpu drops below
    capacity (the device plugin lists the devices Unhealthy). There is no node condition for
    it: neither the kubelet nor GKE sets one.
    """
    capacity = {"cpu": node.cpu, "memory": node.memory, "pods": node.pods}
    allocatable = dict(capacity)
    if node.tpu_chips:
        capacity[TPU_RESOURCE] = str(node.tpu_chips)
        allocatable[TPU_RESOURCE] = str(node.tpu_chips if tpu_healthy else 0)

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": ready_since,
        }

    conditions = [
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "enough memory"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "enough disk"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID", "enough PIDs"),
        condition("Ready", "True", "KubeletReady", "node agent is posting ready status")
        if ready
        else condition(
            "Ready",
            "False",
            "KubeletNotReady",
            "container runtime status check may not have completed yet",
        ),
    ]
    return {
        "capacity": capacity,
        "allocatable": allocatable,
        "conditions": conditions,
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": node.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": log_port}},
        "nodeInfo": {
            "machineID": node.name,
            "systemUUID": node.name,
            "bootID": node.name,
            "kernelVersion": "local",
            "osImage": "tpujob local node",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "containerRuntimeVersion": "tpujob-local://0.1",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": "",
        },
    }
