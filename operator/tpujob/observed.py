"""What the operator observed of one job, as frozen values built from raw API objects.

Pure: parsing only. The adapter layer (`tpujob.kube`) fetches the raw objects; the planner
reads these views and never a raw dict, so what a decision depended on is visible in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tpujob import contract, labels
from tpujob.api import TPUTrainingJob


def parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = str(value).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class PodView:
    """One trainer pod of the job."""

    name: str
    uid: str
    attempt: int
    slice: int
    worker: int
    node: str | None
    phase: str
    created: datetime | None
    deleting_since: datetime | None = None
    running: bool = False
    running_since: datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    disruption_reason: str | None = None
    unschedulable_message: str | None = None
    node_pool: str | None = None

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"


def pod_view(raw: Mapping[str, Any]) -> PodView:
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    pod_labels = meta.get("labels") or {}
    terminated: Mapping[str, Any] = {}
    running = False
    running_since: datetime | None = None
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "terminated" in state:
            terminated = state["terminated"]
        if "running" in state:
            running = True
            since = parse_time(state["running"].get("startedAt"))
            if since is not None and (running_since is None or since > running_since):
                running_since = since
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    disruption = conditions.get("DisruptionTarget")
    scheduled = conditions.get("PodScheduled")
    unschedulable = None
    if scheduled and scheduled.get("status") == "False":
        unschedulable = scheduled.get("message") or scheduled.get("reason") or "unschedulable"
    return PodView(
        name=meta["name"], uid=meta.get("uid", ""),
        attempt=_int(pod_labels.get(labels.ATTEMPT)) or 0,
        slice=_int(pod_labels.get(labels.SLICE)) or 0,
        worker=_int(pod_labels.get(labels.WORKER)) or 0,
        node=spec.get("nodeName"), phase=status.get("phase") or "Pending",
        created=parse_time(meta.get("creationTimestamp")),
        deleting_since=parse_time(meta.get("deletionTimestamp")),
        running=running, running_since=running_since,
        exit_code=_int(terminated.get("exitCode")),
        signal=_int(terminated.get("signal")),
        reason=terminated.get("reason"),
        message=str(terminated.get("message") or status.get("message") or ""),
        started_at=parse_time(terminated.get("startedAt")),
        finished_at=parse_time(terminated.get("finishedAt")),
        disruption_reason=(disruption or {}).get("reason")
        if (disruption or {}).get("status") == "True" else None,
        unschedulable_message=unschedulable,
        node_pool=(spec.get("nodeSelector") or {}).get(labels.NODEPOOL),
    )


@dataclass(frozen=True)
class NodeView:
    """A node as placement and diagnosis see it."""

    name: str
    pool: str | None
    accelerator: str | None
    topology: str | None
    ready: str  # "True", "False" or "Unknown"
    taints: tuple[tuple[str, str], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    tpu_capacity: int = 0
    tpu_allocatable: int = 0
    tpu_unhealthy: bool = False
    tpu_unhealthy_message: str = ""
    unschedulable: bool = False

    def has_taint(self, key: str) -> bool:
        return any(k == key for k, _ in self.taints)

    @property
    def lost(self) -> bool:
        return self.ready != "True" or self.has_taint(labels.UNREACHABLE_TAINT) or \
            self.has_taint(labels.OUT_OF_SERVICE_TAINT)

    @property
    def under_maintenance(self) -> bool:
        return any(self.has_taint(t) for t in labels.MAINTENANCE_TAINTS) or any(
            self.labels.get(k) == v for k, v in labels.MAINTENANCE_LABELS.items())

    @property
    def tpu_degraded(self) -> bool:
        return self.tpu_unhealthy or (self.tpu_capacity > 0 and
                                      self.tpu_allocatable < self.tpu_capacity)

    def healthy_for(self, bad_nodes: frozenset[str]) -> bool:
        return not (self.lost or self.under_maintenance or self.tpu_degraded or
                    self.unschedulable or self.name in bad_nodes or
                    self.has_taint(labels.BAD_NODE_TAINT))


def node_view(raw: Mapping[str, Any]) -> NodeView:
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    node_labels = meta.get("labels") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    tpu = conditions.get(labels.TPU_UNHEALTHY_CONDITION) or {}
    return NodeView(
        name=meta["name"], pool=node_labels.get(labels.NODEPOOL),
        accelerator=node_labels.get(labels.ACCELERATOR),
        topology=node_labels.get(labels.TOPOLOGY),
        ready=(conditions.get("Ready") or {}).get("status", "Unknown"),
        taints=tuple((t.get("key", ""), t.get("effect", "")) for t in spec.get("taints") or []),
        labels=dict(node_labels),
        tpu_capacity=_int((status.get("capacity") or {}).get(labels.TPU_RESOURCE)) or 0,
        tpu_allocatable=_int((status.get("allocatable") or {}).get(labels.TPU_RESOURCE)) or 0,
        tpu_unhealthy=tpu.get("status") == "True",
        tpu_unhealthy_message=str(tpu.get("message") or ""),
        unschedulable=bool(spec.get("unschedulable")),
    )


@dataclass(frozen=True)
class Heartbeat:
    """Worker 0's heartbeat Lease."""

    renewed: datetime | None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    steps_per_second: float | None = None
    checkpoint_step: int | None = None
    attempt: int | None = None


def heartbeat_view(raw: Mapping[str, Any] | None) -> Heartbeat | None:
    if raw is None:
        return None
    notes = (raw.get("metadata") or {}).get("annotations") or {}

    def number(key: str) -> float | None:
        try:
            return float(notes[key])
        except (KeyError, TypeError, ValueError):
            return None

    return Heartbeat(
        renewed=parse_time((raw.get("spec") or {}).get("renewTime")),
        step=_int(notes.get(contract.HEARTBEAT_STEP)),
        total_steps=_int(notes.get(contract.HEARTBEAT_TOTAL_STEPS)),
        loss=number(contract.HEARTBEAT_LOSS),
        steps_per_second=number(contract.HEARTBEAT_STEPS_PER_SECOND),
        checkpoint_step=_int(notes.get(contract.HEARTBEAT_CHECKPOINT_STEP)),
        attempt=_int(notes.get(contract.HEARTBEAT_ATTEMPT)),
    )


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile of one job looked at."""

    job: TPUTrainingJob
    pods: tuple[PodView, ...]
    nodes: Mapping[str, NodeView]
    heartbeat: Heartbeat | None
    # TPU chips requested on each pool by pods of other jobs (placement avoids busy pools).
    busy_pools: frozenset[str] = frozenset()
    log_tails: Mapping[str, str] = field(default_factory=dict)

    def attempt_pods(self, attempt: int) -> tuple[PodView, ...]:
        return tuple(p for p in self.pods if p.attempt == attempt)
