"""Facts to signals: the node, pod, scheduler and heartbeat conditions a worker's facts show.

The node rules of the table (`rules.yaml`) match on these signals; each comes with the text
that is its evidence. Pure.
"""

from __future__ import annotations

from tpujob.diagnosis import facts as f
from tpujob.diagnosis.rules import NodeSignal

SIGNAL_NAMES = {
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    15: "SIGTERM",
}


def node_signals(worker: f.WorkerFacts) -> dict[NodeSignal, str]:
    """The node/pod/scheduler/heartbeat conditions present, each with its evidence text."""
    found: dict[NodeSignal, str] = {}
    node = worker.node
    if node is not None:
        if not node.exists:
            found[NodeSignal.NODE_GONE] = f"node {node.name} no longer exists"
        if node.accelerator_unhealthy:
            found[NodeSignal.ACCELERATOR_UNHEALTHY] = f"node {node.name} reports TPU unhealthy"
        if (
            node.tpu_allocatable is not None
            and node.tpu_requested is not None
            and node.tpu_allocatable < node.tpu_requested
        ):
            found[NodeSignal.TPU_ALLOCATABLE_DROPPED] = (
                f"node {node.name} allocatable google.com/tpu={node.tpu_allocatable}"
                f" < requested {node.tpu_requested}"
            )
        if f.TAINT_OUT_OF_SERVICE in node.taints:
            found[NodeSignal.NODE_OUT_OF_SERVICE] = (
                f"node {node.name} tainted {f.TAINT_OUT_OF_SERVICE}"
            )
        maintenance = [t for t in node.taints if t in f.MAINTENANCE_TAINTS] + [
            f"{key}={value}" for key, value in f.MAINTENANCE_LABELS if node.labels.get(key) == value
        ]
        if maintenance:
            found[NodeSignal.MAINTENANCE] = f"node {node.name}: {', '.join(maintenance)}"
        if f.SCHEDULED_MAINTENANCE_LABEL in node.labels:
            found[NodeSignal.MAINTENANCE_SCHEDULED] = (
                f"{f.SCHEDULED_MAINTENANCE_LABEL}={node.labels[f.SCHEDULED_MAINTENANCE_LABEL]}"
            )
        if node.ready in ("False", "Unknown"):
            found[NodeSignal.NODE_NOT_READY] = f"node {node.name} Ready={node.ready}"
        lost_taints = [t for t in node.taints if t in (f.TAINT_UNREACHABLE, f.TAINT_NOT_READY)]
        if lost_taints:
            found[NodeSignal.NODE_UNREACHABLE] = (
                f"node {node.name} tainted {', '.join(lost_taints)}"
            )
    disruption = {
        f.DISRUPTION_TAINT_MANAGER: NodeSignal.DISRUPTION_TAINT_MANAGER,
        f.DISRUPTION_PREEMPTION: NodeSignal.DISRUPTION_PREEMPTION,
        f.DISRUPTION_EVICTION_API: NodeSignal.DISRUPTION_EVICTION,
        f.DISRUPTION_KUBELET: NodeSignal.DISRUPTION_KUBELET,
    }.get(worker.disruption or "")
    if disruption is not None:
        found[disruption] = f"DisruptionTarget reason {worker.disruption}"
    if worker.effective_signal in (9, 15) and worker.reason != f.REASON_OOM_KILLED:
        found[NodeSignal.KILLED_BY_SIGNAL] = exit_text(worker)
    if worker.pending is not None:
        found[NodeSignal.PENDING] = f"pending: {worker.pending.message}"
    if worker.heartbeat is not None and worker.heartbeat.stalled:
        found[NodeSignal.HEARTBEAT_STALLED] = (
            f"no heartbeat for {worker.heartbeat.seconds_since:.0f}s"
            f" (stall timeout {worker.heartbeat.stall_timeout:.0f}s)"
        )
    return found


def exit_text(worker: f.WorkerFacts) -> str:
    parts = []
    if worker.exit_code is not None:
        parts.append(f"exit code {worker.exit_code}")
    signal = worker.effective_signal
    if signal is not None:
        parts.append(SIGNAL_NAMES.get(signal, f"signal {signal}"))
    if worker.reason:
        parts.append(f"reason {worker.reason}")
    return ", ".join(parts) or "no exit status"
