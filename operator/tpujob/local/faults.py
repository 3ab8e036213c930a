"""`tpujob local fault ...`: real faults, seen by the control plane as a GKE cluster sees them.

* kill POD: a signal to the container's process (the process really dies); with `--leaf`, to
  the deepest process under it instead: the training process where the container's main
  process is a supervisor or agent that runs it as a child (a trainer's crash, an OOM kill).
* node-down / node-up NODE: the agent stops (or resumes) the node's heartbeats; its pods'
  processes die and their network is cut, as when a host crashes or loses its cable. node-up
  also ends the faults below that leave the processes running.
* kubelet-stop NODE: the node's kubelet goes silent (no heartbeats, no status, no pod started,
  stopped or deleted) while its containers run on with their network, as after a kubelet crash
  or a partition of the host from the control plane; node-up starts it again, and it then
  kills the containers of pods deleted meanwhile.
* not-ready / ready NODE: the kubelet posts Ready=False (a container runtime or PLEG hiccup)
  or Ready=True again; heartbeats and pods go on.
* partition POD: the pod's link to the bridge goes down while its process lives on.
* tpu-unhealthy NODE: what a kubelet shows when the TPU device plugin reports the host's chips
  failed: allocatable google.com/tpu drops to 0 (capacity stays), and every pod holding those
  chips reports them Unhealthy in containerStatuses[].allocatedResourcesStatus. No node
  condition: GKE sets none for it.
* maintenance NODE: GKE's impending-termination taint and maintenance label are set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client, config

from tpujob.local import network
from tpujob.local.agent.agent import fault_path, read_faults
from tpujob.local.agent.runtime import container_main_pid
from tpujob.local.controlplane import ClusterState
from tpujob.local.processes import ComponentError, child_pids, process_start_time

MAINTENANCE_TAINT = {
    "key": "cloud.google.com/impending-node-termination",
    "value": "true",
    "effect": "NoSchedule",
}
MAINTENANCE_LABEL = ("cloud.google.com/active-node-maintenance", "ONGOING")


@dataclass(frozen=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    node: str
    directory: Path


def find_pod(state_dir: Path, name: str, namespace: str | None = None) -> PodRecord:
    """The newest local pod called `name` (in `namespace`, if given)."""
    matches = []
    for meta_file in (state_dir / "agent" / "pods").glob("*/meta.json"):
        meta = json.loads(meta_file.read_text())
        if meta["name"] == name and namespace in (None, meta["namespace"]):
            matches.append(
                (
                    meta_file.stat().st_mtime,
                    PodRecord(
                        meta["uid"], meta["namespace"], meta["name"], meta["node"], meta_file.parent
                    ),
                )
            )
    if not matches:
        where = f" in namespace {namespace}" if namespace else ""
        raise ComponentError(f"no pod {name}{where} has run on this local cluster")
    return max(matches, key=lambda m: m[0])[1]


def kill_pod(
    state_dir: Path, pod: PodRecord, sig: int = signal.SIGKILL, *, leaf: bool = False
) -> int:
    """Signal the main process of every running container of `pod` (with `leaf`, the deepest
    process under it); returns how many."""
    count = 0
    for pid_file in pod.directory.glob("containers/*/pid"):
        data = json.loads(pid_file.read_text())
        if process_start_time(int(data["pid"])) != data.get("start"):
            continue
        main = container_main_pid(int(data["pid"]))
        os.kill(deepest_descendant(main) if leaf else main, sig)
        count += 1
    if count == 0:
        raise ComponentError(f"pod {pod.namespace}/{pod.name} has no running process")
    return count


def deepest_descendant(pid: int, proc: Path = Path("/proc")) -> int:
    """The process furthest below `pid` in its process tree (`pid` itself when it has no
    child); of several at that depth, the one with the highest pid. A supervisor's or agent's
    training process is its only child, so this is the process that trains."""
    best, level = pid, [pid]
    while level := [child for parent in level for child in child_pids(parent, proc)]:
        best = max(level)
    return best


def set_node_fault(state_dir: Path, node: str, **changes: bool) -> None:
    state = _state(state_dir)
    from tpujob.local.agent.nodes import plan_nodes

    names = {
        n.name
        for n in plan_nodes(
            state.pools.pools,
            state.pools.accelerator,
            state.pools.topology,
            state.pools.spare_nodes,
        )
    }
    if node not in names:
        raise ComponentError(f"no node {node}; nodes: {', '.join(sorted(names))}")
    data = {**dataclasses.asdict(read_faults(state_dir, node)), **changes}
    path = fault_path(state_dir, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def partition_pod(state_dir: Path, pod: PodRecord, *, heal: bool = False) -> None:
    network.set_pod_link(_state(state_dir).network, pod.uid, up=heal)


def maintenance(state_dir: Path, node: str) -> None:
    core = client.CoreV1Api(config.new_client_from_config(str(state_dir / "kubeconfig")))
    current = core.read_node(node)
    taints = [
        {"key": t.key, "value": t.value, "effect": t.effect} for t in (current.spec.taints or [])
    ]
    taints = [{k: v for k, v in t.items() if v is not None} for t in taints]
    if not any(t["key"] == MAINTENANCE_TAINT["key"] for t in taints):
        taints.append(dict(MAINTENANCE_TAINT))
    core.patch_node(
        node,
        {
            "metadata": {"labels": {MAINTENANCE_LABEL[0]: MAINTENANCE_LABEL[1]}},
            "spec": {"taints": taints},
        },
        _content_type="application/merge-patch+json",
    )


def _state(state_dir: Path) -> ClusterState:
    state = ClusterState.load(state_dir)
    if state is None or not state.alive_components():
        raise ComponentError(f"no cluster is running in {state_dir}")
    return state
