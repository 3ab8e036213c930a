"""The observed facts the diagnosis reads: plain frozen values the operator fills in.

Nothing here knows about Kubernetes objects; the operator copies fields from pods, nodes,
Leases and its own status into these values. Strings stay strings where Kubernetes spells
them (termination reasons, DisruptionTarget reasons, taint keys) so the copying is direct.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

_Facts = TypeVar("_Facts")

# Kubernetes spellings the engine compares against.
DISRUPTION_PREEMPTION = "PreemptionByScheduler"
DISRUPTION_TAINT_MANAGER = "DeletionByTaintManager"
DISRUPTION_EVICTION_API = "EvictionByEvictionAPI"
DISRUPTION_KUBELET = "TerminationByKubelet"
REASON_OOM_KILLED = "OOMKilled"

TAINT_UNREACHABLE = "node.kubernetes.io/unreachable"
TAINT_NOT_READY = "node.kubernetes.io/not-ready"
TAINT_OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
# GKE maintenance taints and labels (label value that means "now", or None for "present").
MAINTENANCE_TAINTS = (
    "cloud.google.com/impending-node-termination",
    "cloud.google.com/maintenance-window-started",
)
MAINTENANCE_LABELS: tuple[tuple[str, str | None], ...] = (
    ("cloud.google.com/active-node-maintenance", "ONGOING"),
    ("cloud.google.com/perform-maintenance", "true"),
)
SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"


@dataclass(frozen=True)
class NodeFacts:
    """The node a worker ran on, as the operator last saw it."""

    name: str = ""
    exists: bool = True  # False once the Node object is gone
    ready: str = "True"  # status of the Ready condition: "True", "False" or "Unknown"
    taints: tuple[str, ...] = ()  # taint keys
    labels: Mapping[str, str] = field(default_factory=dict)
    accelerator_unhealthy: bool = False  # a node condition reports the TPU unhealthy
    tpu_allocatable: int | None = None  # allocatable google.com/tpu now
    tpu_requested: int | None = None  # google.com/tpu the worker's pod asked for


@dataclass(frozen=True)
class PendingFacts:
    """A worker pod that never started: the scheduler's message and how long it has waited."""

    message: str
    seconds_pending: float = 0.0


@dataclass(frozen=True)
class HeartbeatFacts:
    """The trainer's heartbeat Lease: seconds since its last renewal vs the stall timeout."""

    seconds_since: float
    stall_timeout: float
    step: int | None = None

    @property
    def stalled(self) -> bool:
        return self.seconds_since > self.stall_timeout


@dataclass(frozen=True)
class WorkerFacts:
    """Everything known about one failed (or stuck) worker."""

    worker_index: int | None = None
    slice_index: int | None = None
    pod_name: str = ""
    node_name: str = ""
    exit_code: int | None = None
    signal: int | None = None  # as the kubelet reports it; derived from 128+N when absent
    reason: str | None = None  # OOMKilled, Error, ContainerCannotRun, StartError...
    message: str = ""  # termination message: the trainer's JSON or free text
    log_tail: str = ""
    context: str = ""  # other free text: pod/node Event messages, status messages, notes
    disruption: str | None = None  # reason of the pod's DisruptionTarget condition
    node: NodeFacts | None = None
    pending: PendingFacts | None = None
    heartbeat: HeartbeatFacts | None = None
    step: int | None = None
    finished_at: datetime | None = None

    @property
    def effective_signal(self) -> int | None:
        if self.signal is not None:
            return self.signal
        if self.exit_code is not None and 128 < self.exit_code <= 128 + 64:
            return self.exit_code - 128
        return None


@dataclass(frozen=True)
class JobFacts:
    """The failed workers of one job attempt, plus the job-wide heartbeat."""

    workers: tuple[WorkerFacts, ...] = ()
    heartbeat: HeartbeatFacts | None = None


def encodable(text: str) -> str:
    """`text` with every code point UTF-8 cannot encode replaced by U+FFFD.

    Those are lone surrogates: a JSON `\\ud800` escape (a termination message, a corpus
    line) or bytes decoded with `surrogateescape` carry them into a `str`, and RE2, the
    hashes and the status all encode to UTF-8. A well-formed pair of surrogates is joined
    into its character, not replaced.
    """
    if text.isascii():  # O(1) in CPython: the common case costs nothing
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _encodable(value: Any) -> Any:
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, tuple):
        cleaned = tuple(_encodable(v) for v in value)
        return value if all(a is b for a, b in zip(cleaned, value, strict=True)) else cleaned
    if isinstance(value, Mapping):
        pairs = {_encodable(k): _encodable(v) for k, v in value.items()}
        same = all(k in value and value[k] is v for k, v in pairs.items())
        return value if same and len(pairs) == len(value) else pairs
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for f in dataclasses.fields(value):
            old = getattr(value, f.name)
            new = _encodable(old)
            if new is not old:
                changes[f.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    return value


def encodable_facts(facts: _Facts) -> _Facts:
    """`facts` (a frozen facts value) with every string in it, nested ones included, made
    `encodable`; the same object when none needed it. The gate for text from outside."""
    cleaned: _Facts = _encodable(facts)
    return cleaned
