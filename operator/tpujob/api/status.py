"""status of a TPUTrainingJob: what the operator observed, counted and did.

Part of the API layer (pydantic only). Only the operator writes the status; models here are
lenient on read (unknown fields kept, every field optional) so a status written by another
operator version still parses. `status_patch` gives the dict to send to the status subresource.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, model_validator

from tpujob.api import constants as c
from tpujob.api.attempt import (
    ATTEMPT_HISTORY_LIMIT,
    FAILURE_HISTORY_LIMIT,
    AttemptRecord,
    AttemptStatus,
    FailureRecord,
)
from tpujob.api.base import StatusModel
from tpujob.api.contract import MAX_COUNT
from tpujob.api.enums import ConditionStatus, ConditionType, FailureClass, Phase

Message = Annotated[str, Field(max_length=c.MAX_MESSAGE_LENGTH)]


class Condition(StatusModel):
    """A condition in the standard Kubernetes shape (metav1.Condition)."""

    type: str = Field(max_length=316, description="Condition type, e.g. Running or SpecValid.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str | None = Field(
        default=None, max_length=1024, description="CamelCase reason for the last transition."
    )
    message: Message | None = Field(default=None, description="Human-readable details.")
    last_transition_time: datetime | None = Field(
        default=None, description="When the status last changed."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the condition was set for."
    )


class Restarts(StatusModel):
    """Restarts so far per failure class; never reset when children are recreated."""

    soft: int = Field(default=0, ge=0, description="Soft restarts (in place, from checkpoint).")
    medium: int = Field(default=0, ge=0, description="Medium restarts (pods recreated).")
    hard: int = Field(default=0, ge=0, description="Hard restarts (slice rescheduled).")
    total: int = Field(
        default=0, ge=0, description="Sum of all restarts (computed; shown by kubectl get)."
    )

    @model_validator(mode="before")
    @classmethod
    def _sum(cls, data: Any) -> Any:
        if isinstance(data, dict):
            counts = [data.get(k, 0) for k in ("soft", "medium", "hard")]
            if all(isinstance(n, int) for n in counts):
                # Each count is an int64 the CRD admitted; their sum may not be one, and a
                # status that says so is refused on every write (the job wedged).
                data = {**data, "total": min(sum(counts), MAX_COUNT)}
        return data

    def count(self, failure_class: FailureClass) -> int:
        """Restarts so far of one class (0 for fatal)."""
        return {
            FailureClass.SOFT: self.soft,
            FailureClass.MEDIUM: self.medium,
            FailureClass.HARD: self.hard,
        }.get(failure_class, 0)

    def incremented(self, failure_class: FailureClass) -> Restarts:
        """A copy with one more restart of `failure_class` (fatal is never restarted)."""
        if failure_class is FailureClass.FATAL:
            return self
        key = str(failure_class)
        counts = {"soft": self.soft, "medium": self.medium, "hard": self.hard}
        counts[key] += 1
        return Restarts.model_validate(counts)


class FailedNode(StatusModel):
    """A node blamed for a hard failure; counted against maxFailedNodes."""

    name: str = Field(max_length=c.MAX_NAME_LENGTH, description="Node name.")
    uid: str | None = Field(
        default=None,
        max_length=64,
        description="The Node object's uid when it was blamed. A "
        "node of that name with another uid is a new one (GKE's auto-repair recreates the VM): "
        "this job no longer avoids it, but it stays counted against maxFailedNodes.",
    )
    time: datetime | None = Field(default=None, description="When it was blamed.")
    code: str | None = Field(default=None, max_length=64, description="Failure code.")
    marked: bool | None = Field(
        default=None,
        description="True once the node was seen tainted or cordoned as "
        "spec.recovery.badNodeAction says; until then every reconcile marks it again, so an "
        "operator restart between the decision and the mark cannot lose the mark.",
    )
    job_only: bool | None = Field(
        default=None,
        description="True when only this job's own history blames the node (its "
        "failure recurred there): this job avoids it and counts it, but it is not marked for "
        "other jobs, since a job's author controls how its program fails.",
    )
    relapsed: bool | None = Field(
        default=None,
        description="True when the node, once trusted again (it came back Ready "
        "after being lost, or its mark was cleared), failed again as the same Node object: "
        "coming back Ready no longer ends this job's avoidance of it; a new Node object or a "
        "cleared mark still does.",
    )


class LastFailure(StatusModel):
    """The diagnosis of the most recent failure."""

    failure_class: FailureClass | None = Field(
        default=None, alias="class", description="soft, medium, hard or fatal."
    )
    code: str | None = Field(default=None, max_length=64, description="Failure code, e.g. HBM_OOM.")
    summary: Message | None = Field(default=None, description="One line about what happened.")
    chain: tuple[Message, ...] = Field(
        default=(),
        max_length=c.MAX_CHAIN,
        description="Error chain from root cause to the cascade it triggered.",
    )
    evidence: tuple[Message, ...] = Field(
        default=(), max_length=c.MAX_EVIDENCE, description="Observed facts behind the diagnosis."
    )
    advice: Message | None = Field(default=None, description="What a user can do about it.")
    pod: str | None = Field(default=None, max_length=c.MAX_NAME_LENGTH, description="Root pod.")
    node: str | None = Field(default=None, max_length=c.MAX_NAME_LENGTH, description="Its node.")
    time: datetime | None = Field(default=None, description="When the failure was seen.")
    action: str | None = Field(
        default=None, max_length=256, description="What the operator did about it."
    )


class Progress(StatusModel):
    """Training progress as reported by the trainer's heartbeat."""

    step: int | None = Field(default=None, ge=0, description="Latest completed step.")
    total_steps: int | None = Field(default=None, ge=0, description="Steps of the full run.")
    steps_per_second: float | None = Field(default=None, ge=0, description="Recent throughput.")
    loss: float | None = Field(default=None, description="The training loss last reported.")


class SparePool(StatusModel):
    """A warm spare: a pool the job holds for its hard failures (`spec.tpu.spares`)."""

    node_pool: str = Field(max_length=c.MAX_NAME_LENGTH, description="The pool held.")
    ready: bool = Field(
        default=False, description="Every host of the pool runs the job's idle pod."
    )


class QueueStatus(StatusModel):
    """The job's place in a Kueue queue: only for a job whose metadata names one
    (`kueue.x-k8s.io/queue-name`)."""

    name: str = Field(max_length=c.MAX_NAME_LENGTH, description="The LocalQueue named.")
    workload: str | None = Field(
        default=None, max_length=253, description="The job's Workload object."
    )
    cluster_queue: str | None = Field(
        default=None, max_length=c.MAX_NAME_LENGTH, description="Its ClusterQueue, once admitted."
    )
    admitted: bool = Field(default=False, description="Kueue admitted it: it may run.")
    waiting_since: datetime | None = Field(
        default=None, description="Since when it waits for admission (absent while admitted)."
    )
    queued_seconds: float = Field(
        default=0,
        ge=0,
        description="Seconds it waited for admission since the job started, past waits only.",
    )
    evictions: int = Field(default=0, ge=0, description="Times Kueue evicted or preempted it.")
    last_eviction: str | None = Field(
        default=None,
        max_length=c.MAX_MESSAGE_LENGTH,
        description="The last eviction's reason and message.",
    )


class TimelineEvent(StatusModel):
    """One recovery event: failure seen, diagnosed, pods recreated, training resumed..."""

    time: datetime = Field(description="When it happened.")
    kind: str = Field(max_length=64, description="Event kind, e.g. Failed, Diagnosed, Resumed.")
    message: Message = Field(default="", description="Details.")


class PendingEvent(StatusModel):
    """An Event decided with the status it explains, kept until a later reconcile.

    Events are emitted after the status write under a name derived from the job's uid and
    the Event's content; a crash between the write and the emission leaves the Event here,
    and the next reconcile emits it again (an existing name is not created twice).
    """

    type: str = Field(max_length=16, description="Normal or Warning.")
    reason: str = Field(max_length=128, description="Event reason.")
    message: Message = Field(default="", description="Event message.")
    time: datetime = Field(description="When it was decided.")


class GoodputBreakdown(StatusModel):
    """Where the job's wall time went, in seconds; the parts sum to `wallSeconds`."""

    wall_seconds: float = Field(ge=0, description="Since the job started (to its end).")
    productive: float = Field(default=0, ge=0, description="Training steps that were kept.")
    startup: float = Field(
        default=0, ge=0, description="Scheduling, image pull, device set-up and compile."
    )
    restore: float = Field(default=0, ge=0, description="Checkpoint restore, when measured.")
    redone: float = Field(
        default=0, ge=0, description="Steps lost to a restart or rollback, and detection."
    )
    data_wait: float = Field(default=0, ge=0, description="Kept steps' time waiting for data.")
    downtime: float = Field(
        default=0, ge=0, description="Between attempts: diagnosis, backoff, rescheduling."
    )
    other: float = Field(
        default=0, ge=0, description="The rest: since the last heartbeat, final save, exit."
    )
    queued: float = Field(
        default=0,
        ge=0,
        description="Waiting for a Kueue admission, at the start or after a preemption.",
    )
    degraded: float = Field(
        default=0,
        ge=0,
        description="Not a part of the sum: of the attempts' time, how much ran on fewer slices "
        "than the job asks for (an elastic job short of pools).",
    )


class TPUTrainingJobStatus(StatusModel):
    """The observed state of a TPU training run."""

    phase: Phase | None = Field(default=None, description="Lifecycle phase.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation last acted on."
    )
    conditions: tuple[Condition, ...] = Field(
        default=(),
        max_length=c.MAX_CONDITIONS,
        description="Standard conditions, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    attempt: int = Field(default=0, ge=0, description="Current attempt; 0 before the first start.")
    restarts: Restarts = Field(default_factory=Restarts, description="Restarts per class.")
    failed_nodes: tuple[FailedNode, ...] = Field(
        default=(),
        max_length=c.MAX_FAILED_NODES_RECORDED,
        description="Nodes blamed for hard failures.",
    )
    failed_node_budget: int | None = Field(
        default=None, ge=0, description="maxFailedNodes resolved to a node count."
    )
    failed_node_budget_left: int | None = Field(
        default=None, description="Nodes that may still fail before the job fails."
    )
    last_failure: LastFailure | None = Field(default=None, description="Most recent failure.")
    checkpoint_step: int | None = Field(
        default=None, ge=0, description="Step of the latest committed checkpoint."
    )
    nan_rollbacks: int | None = Field(
        default=None, ge=0, description="Rollbacks done after a non-finite loss."
    )
    skip_batches: str | None = Field(
        default=None,
        max_length=1024,
        description="Data windows skipped after non-finite losses, STEP:N,... (after step STEP, "
        "N batches); given to every later attempt.",
    )
    progress: Progress | None = Field(default=None, description="Training progress.")
    goodput: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Fraction of wall time since start spent on productive training steps.",
    )
    goodput_breakdown: GoodputBreakdown | None = Field(
        default=None, description="Wall time by category (productive is the goodput)."
    )
    attempt_history: tuple[AttemptRecord, ...] = Field(
        default=(),
        max_length=ATTEMPT_HISTORY_LIMIT,
        description=f"The last {ATTEMPT_HISTORY_LIMIT} attempts that ended, oldest first "
        "(the goodput breakdown's facts).",
    )
    spares: tuple[SparePool, ...] = Field(
        default=(),
        max_length=c.MAX_SPARES,
        description="The warm spare pools the job holds (spec.tpu.spares).",
    )
    queue: QueueStatus | None = Field(
        default=None, description="Its Kueue queue and admission, when it names a queue."
    )
    start_time: datetime | None = Field(default=None, description="When the job first started.")
    completion_time: datetime | None = Field(default=None, description="When it finished.")
    current_attempt: AttemptStatus = Field(
        default_factory=AttemptStatus, description="How the current attempt is run."
    )
    failure_history: tuple[FailureRecord, ...] = Field(
        default=(),
        max_length=FAILURE_HISTORY_LIMIT,
        description=f"The last {FAILURE_HISTORY_LIMIT} failures, oldest first.",
    )
    timeline: tuple[TimelineEvent, ...] = Field(
        default=(),
        max_length=c.TIMELINE_LIMIT,
        description=f"The last {c.TIMELINE_LIMIT} recovery events, oldest first.",
    )
    pending_events: tuple[PendingEvent, ...] = Field(
        default=(),
        max_length=c.TIMELINE_LIMIT,
        description="Events of the last decision, kept until emitted (the operator's journal).",
    )

    def with_event(self, event: TimelineEvent) -> TPUTrainingJobStatus:
        """A copy with `event` appended to the timeline, keeping only the newest ones."""
        timeline = (*self.timeline, event)[-c.TIMELINE_LIMIT :]
        return self.model_copy(update={"timeline": timeline})

    def condition(self, condition_type: str) -> Condition | None:
        """The condition of a type, if set."""
        return next((x for x in self.conditions if x.type == condition_type), None)

    def with_condition(self, condition: Condition) -> TPUTrainingJobStatus:
        """A copy with `condition` replacing any condition of the same type.

        The transition time is kept when the status value did not change, as Kubernetes
        conventions ask; the order is kept too, so an unchanged status compares equal and
        costs no write.
        """
        old = self.condition(condition.type)
        if old is not None and old.status == condition.status and old.last_transition_time:
            condition = condition.model_copy(
                update={"last_transition_time": old.last_transition_time}
            )
        if old is None:
            return self.model_copy(update={"conditions": _bounded((*self.conditions, condition))})
        return self.model_copy(
            update={
                "conditions": tuple(
                    condition if x.type == condition.type else x for x in self.conditions
                )
            }
        )


_OWN_CONDITION_TYPES = frozenset(ConditionType)


def _bounded(conditions: tuple[Condition, ...]) -> tuple[Condition, ...]:
    """`conditions` within the CRD's maxItems. A status may hold types this operator never
    sets (another version's, or a tenant's own) up to the bound; one more of the operator's
    own would make every later status write refused (the job wedged). The oldest of the
    foreign types make room; the operator's own types alone are fewer than the bound."""
    while len(conditions) > c.MAX_CONDITIONS:
        gone = next((x for x in conditions if x.type not in _OWN_CONDITION_TYPES), conditions[0])
        conditions = tuple(x for x in conditions if x is not gone)
    return conditions


def status_patch(status: TPUTrainingJobStatus) -> dict[str, Any]:
    """The status as JSON-ready camelCase data, without unset (None) fields."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)
