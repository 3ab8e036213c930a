"""The result of planning one reconcile: the new status and the effects that follow it.

Values only. The controller writes `status` first (one write), then carries out the effects in
the order the fields are listed, then emits the Events; a decision is therefore on record
before anything acts on it, and an operator restarted in between finishes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from fnmatch import fnmatchcase
from typing import Any, TypedDict, Unpack

from tpujob import diagnosis as dx
from tpujob.api import (
    BadNodeAction,
    Condition,
    ConditionStatus,
    PendingEvent,
    TimelineEvent,
    TPUTrainingJobStatus,
)
from tpujob.api import constants as c
from tpujob.api.attempt import AttemptRecord, AttemptStatus, FailureRecord
from tpujob.api.enums import ConditionType, Phase
from tpujob.api.reasons import EventReason, EventType
from tpujob.api.status import (
    FailedNode,
    GoodputBreakdown,
    LastFailure,
    Progress,
    QueueStatus,
    Restarts,
    SparePool,
)
from tpujob.diagnosis.memory import Blame
from tpujob.observed.nodes import DEFAULT_HEALTH, NodeHealthSettings


@dataclass(frozen=True)
class PodDeletion:
    name: str
    uid: str
    grace_seconds: int | None  # None: the pod's own terminationGracePeriodSeconds


@dataclass(frozen=True)
class PodRejoin:
    """A kept pod moved to the new attempt: its attempt label and its rejoin order."""

    name: str
    uid: str
    attempt: int
    order: str  # the annotation's value (`contract.encode_rejoin`)


@dataclass(frozen=True)
class NodeMark:
    """Mark a node bad for every job, or (`clear`) take off the mark whose reason is `reason`."""

    node: str
    action: BadNodeAction
    reason: str
    clear: bool = False


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal or Warning
    reason: str
    message: str
    at: datetime | None = None  # when it was decided: part of its name, so it is told once


@dataclass(frozen=True)
class WorkloadPriority:
    """The priority class a Workload takes its priority from; the shell reads its value."""

    group: str
    kind: str
    name: str


@dataclass(frozen=True)
class WorkloadWrite:
    """One write to the job's Kueue Workload (`tpujob.plan.queueing`): create it, or set
    `spec.active` and its annotations, and replace its conditions and clear its admission (on
    the status, only if it is still at `resource_version`)."""

    name: str
    create: dict[str, Any] | None = None
    priority: WorkloadPriority | None = None
    resource_version: str | None = None
    active: bool | None = None
    # Annotations to set (a None value removes one): the checkpoint-aware priority boost.
    annotations: Mapping[str, str | None] | None = None
    conditions: tuple[dict[str, Any], ...] | None = None
    clear_admission: bool = False


@dataclass(frozen=True)
class PlannerSettings:
    """Operator-wide knobs of the planner (command-line flags of `tpujob operator`)."""

    force_delete_after_seconds: float = 10.0
    restart_grace_seconds: int = 5
    unknown_retry_limit: int = dx.DEFAULT_UNKNOWN_RETRY_LIMIT
    poll_seconds: float = 5.0
    # The net under a steadily running job's deadlines (`tpujob.plan.deadlines`): its events
    # and its heartbeat wake it, and the stall timeout is a deadline of its own.
    steady_poll_seconds: float = 60.0
    # A failure that only says "a peer went away" waits this long for the peer's own status,
    # so the root cause, not its echo, is diagnosed.
    cascade_settle_seconds: float = 3.0
    # Collective and coordination timeout given the trainer; medium retries double it.
    collective_timeout_seconds: int = 60
    # How long a node's trouble must last before it is a failure (debounce).
    node_health: NodeHealthSettings = DEFAULT_HEALTH
    # Namespaces (glob patterns) whose jobs' own history may get a node marked for everyone:
    # a failure recurring on one node taints it. Elsewhere that node is only avoided by the job
    # (a job's author controls how its program fails, so on a shared cluster one tenant must
    # not be able to taint nodes); the cross-namespace ledger marks it there.
    trusted_namespaces: tuple[str, ...] = ()
    # When a failure concerns some slices only, and the trainers say they can rejoin, only
    # those slices' pods are replaced and the others restart in place; after a hang every
    # trainer restarts in its pod (off: every pod is replaced).
    slice_restarts: bool = True
    # The node paths a job's hostPath checkpoint may lie under (`--host-path-prefixes`, the
    # chart's hostPathPrefixes); empty allows none. None: the operator was given no list and
    # leaves hostPath to the cluster's admission (the chart's policy) alone.
    host_path_prefixes: tuple[str, ...] | None = None
    # Seconds of work a preemption would lose per point of Kueue priority boost on a running
    # job's Workload (`tpujob.plan.queueing`): a site whose jobs save rarely may want coarser
    # points, so the boost's cap is reached only by work that is really at risk.
    preemption_boost_seconds: float = 60.0

    def trusts_history_of(self, namespace: str) -> bool:
        return any(fnmatchcase(namespace, pattern) for pattern in self.trusted_namespaces)


@dataclass(frozen=True)
class Plan:
    status: TPUTrainingJobStatus
    create: tuple[dict[str, Any], ...] = ()
    delete_pods: tuple[PodDeletion, ...] = ()
    # The fencing token written on the heartbeat Lease before any pod of `create` exists: the
    # attempt that alone may commit checkpoints from now on.
    fence_attempt: int | None = None
    # Kept pods told to rejoin the attempt; after the fence, before `create`.
    rejoin_pods: tuple[PodRejoin, ...] = ()
    mark_nodes: tuple[NodeMark, ...] = ()
    events: tuple[EventSpec, ...] = ()
    requeue_after: float = 5.0
    delete_job: bool = False
    diagnosis: dx.Diagnosis | None = None
    recovery_seconds: float | None = None  # failure seen -> training resumed, when it resumed
    ledger_blame: Blame | None = None  # a soft blame of a node for the shared node ledger
    workload: WorkloadWrite | None = None  # last: Kueue hears of a stop once it is under way


class StatusEdit(TypedDict, total=False):
    """The status fields a plan sets by `Draft.update`, each with its type, so that mypy checks
    every edit. Conditions and the timeline are not here: they change only through
    `Draft.condition` and `Draft.timeline`, which stamp and bound them."""

    phase: Phase
    observed_generation: int | None
    attempt: int
    restarts: Restarts
    failed_nodes: tuple[FailedNode, ...]
    failed_node_budget: int | None
    failed_node_budget_left: int | None
    last_failure: LastFailure | None
    checkpoint_step: int | None
    nan_rollbacks: int | None
    skip_batches: str | None
    progress: Progress | None
    goodput: float | None
    goodput_breakdown: GoodputBreakdown | None
    attempt_history: tuple[AttemptRecord, ...]
    start_time: datetime | None
    completion_time: datetime | None
    current_attempt: AttemptStatus
    failure_history: tuple[FailureRecord, ...]
    pending_events: tuple[PendingEvent, ...]
    spares: tuple[SparePool, ...]
    queue: QueueStatus | None


@dataclass
class Draft:
    """A plan being built: a status copy plus effects. Lives for one `plan()` call only."""

    status: TPUTrainingJobStatus
    now: datetime
    create: list[dict[str, Any]] = field(default_factory=list)
    delete_pods: list[PodDeletion] = field(default_factory=list)
    fence_attempt: int | None = None
    rejoin_pods: list[PodRejoin] = field(default_factory=list)
    mark_nodes: list[NodeMark] = field(default_factory=list)
    events: list[EventSpec] = field(default_factory=list)
    # The poll when nothing asks for an earlier look: the operator's, a longer one for a job
    # in a state only events change (finished, running steadily), set by the planner.
    requeue_after: float = 5.0
    delete_job: bool = False
    diagnosis: dx.Diagnosis | None = None
    recovery_seconds: float | None = None
    ledger_blame: Blame | None = None
    workload: WorkloadWrite | None = None
    # The earliest look asked for by a deadline (`requeue`); it wins over any poll.
    asked: float | None = None

    def update(self, **changes: Unpack[StatusEdit]) -> None:
        self.status = self.status.model_copy(update=dict(changes))

    def timeline(self, kind: StrEnum, message: str, at: datetime | None = None) -> None:
        self.status = self.status.with_event(
            TimelineEvent(time=at or self.now, kind=kind, message=message[: c.MAX_MESSAGE_LENGTH])
        )

    def condition(
        self, kind: ConditionType, value: bool, reason: StrEnum, message: str = ""
    ) -> None:
        self.status = self.status.with_condition(
            Condition(
                type=kind,
                status=ConditionStatus.TRUE if value else ConditionStatus.FALSE,
                reason=reason,
                message=message[: c.MAX_MESSAGE_LENGTH] or None,
                last_transition_time=self.now,
            )
        )

    def event(self, kind: EventType, reason: StrEnum, message: str) -> None:
        self.events.append(EventSpec(kind, reason, message[: c.MAX_MESSAGE_LENGTH], self.now))

    def requeue(self, seconds: float) -> None:
        """Look at the job again within `seconds` (a deadline: a later poll does not undo it)."""
        seconds = max(0.1, seconds)
        self.asked = seconds if self.asked is None else min(self.asked, seconds)

    @property
    def next_look(self) -> float:
        return self.requeue_after if self.asked is None else min(self.requeue_after, self.asked)

    def done(self) -> Plan:
        """The plan; its Events are those journaled by the previous reconcile (told again,
        harmlessly, in case a crash lost them) and this one's, journaled in the status."""
        resend = tuple(
            EventSpec(e.type, e.reason, e.message, e.time) for e in self.status.pending_events
        )
        journal = tuple(
            PendingEvent(type=e.type, reason=e.reason, message=e.message, time=e.at or self.now)
            for e in _bounded_journal(self.events, self.now)
        )
        self.update(pending_events=journal)
        return Plan(
            status=self.status,
            create=tuple(self.create),
            delete_pods=tuple(self.delete_pods),
            fence_attempt=self.fence_attempt,
            rejoin_pods=tuple(self.rejoin_pods),
            mark_nodes=tuple(self.mark_nodes),
            events=(*resend, *self.events),
            requeue_after=self.next_look,
            delete_job=self.delete_job,
            diagnosis=self.diagnosis,
            recovery_seconds=self.recovery_seconds,
            ledger_blame=self.ledger_blame,
            workload=self.workload,
        )


def _bounded_journal(events: list[EventSpec], now: datetime) -> list[EventSpec]:
    """The Events to journal in the status, within its bound: past it, the last place says how
    many more this decision told and of which reasons (all are told; only their journal, for a
    crash between the status write and the telling, is cut short). A bound the CRD enforces,
    so a decision with more Events (many nodes back at once) would otherwise wedge the job."""
    if len(events) <= c.TIMELINE_LIMIT:
        return events
    kept, rest = events[: c.TIMELINE_LIMIT - 1], events[c.TIMELINE_LIMIT - 1 :]
    counts: dict[str, int] = {}
    for e in rest:
        counts[e.reason] = counts.get(e.reason, 0) + 1
    warning = any(e.type == EventType.WARNING for e in rest)
    summary = f"{len(rest)} more Events of this decision: " + ", ".join(
        f"{reason} x{n}" for reason, n in sorted(counts.items())
    )
    return [
        *kept,
        EventSpec(
            EventType.WARNING if warning else EventType.NORMAL,
            EventReason.MORE_EVENTS,
            summary[: c.MAX_MESSAGE_LENGTH],
            now,
        ),
    ]
