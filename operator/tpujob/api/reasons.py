"""Every reason the operator writes, as enums: condition reasons, Event types and reasons, and
the kinds of the job's timeline.

Bottom layer, values only. Users and dashboards match on these words (`kubectl get events
--field-selector reason=Restarting`, a condition's reason in an alert), so they are part of
the API: one place to read them all, and no literal elsewhere that could drift from them.
"""

from __future__ import annotations

import enum


class EventType(enum.StrEnum):
    """The two types of a Kubernetes Event."""

    NORMAL = "Normal"
    WARNING = "Warning"


class ConditionReason(enum.StrEnum):
    """The reasons of the job's conditions, but for Failed (`FailReason`), a health condition
    (`tpujob.observed.training.HealthReason`) and Recovering (the failure's code)."""

    VALID = "Valid"
    INVALID_SPEC = "InvalidSpec"
    WITHIN_BUDGET = "WithinBudget"
    PLANNING_BUDGET_EXCEEDED = "PlanningBudgetExceeded"
    OFFERED = "Offered"
    NOT_OFFERED = "NotOffered"
    RESUMED = "Resumed"
    NOT_SUSPENDED = "NotSuspended"
    SUSPENDED = "Suspended"
    WAITING_FOR_POOL = "WaitingForPool"
    """Running=False: some slice has no free pool of the job's shape."""
    PROVISIONING = "Provisioning"
    """Running=False: some slice's pods wait for the autoscaler to provide a pool."""
    UNSCHEDULABLE = "Unschedulable"
    NOT_STARTED = "NotStarted"
    """Running=False: a pod on its node has not started its container for a while."""
    CREATED = "Created"
    FAILED_CREATE = "FailedCreate"
    ALL_WORKERS_RUNNING = "AllWorkersRunning"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    RESIZING = "Resizing"
    ALL_WORKERS_SUCCEEDED = "AllWorkersSucceeded"
    FINISHED = "Finished"
    HEALTHY = "Healthy"
    ANNOUNCED = "Announced"
    """Heartbeat=True: the trainer wrote its heartbeat Lease for this attempt."""
    NOT_ANNOUNCED = "NotAnnounced"
    """Heartbeat=False: the trainer's workers run but it never wrote the Lease."""
    STALL_DETECTION_OFF = "StallDetectionOff"
    """Heartbeat=False: spec.recovery.stallTimeoutSeconds is 0."""
    NEAR_OPTIMUM = "NearOptimum"
    """CheckpointCadence=True: the interval is within a factor of two of the optimum."""
    SAVES_TOO_OFTEN = "SavesTooOften"
    """CheckpointCadence=False: saves cost more than the progress they protect."""
    SAVES_TOO_RARELY = "SavesTooRarely"
    """CheckpointCadence=False: failures redo more steps than saves would cost."""
    NO_FAILURE_YET = "NoFailureYet"
    """CheckpointCadence=True: saves are not too frequent; too rare shows after a failure."""
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    """Suspended=True: the job's Kueue queue has not admitted it (yet, or again)."""
    EVICTED = "Evicted"
    """Suspended=True: Kueue evicted or preempted the job; it stops, saves and is requeued."""
    ADMITTED = "Admitted"
    """Suspended=False: Kueue admitted the job."""


class FailReason(enum.StrEnum):
    """Why a job is failed instead of restarted: the Failed condition's reason and its Event's."""

    FATAL = "FatalFailure"
    AUTO_RECOVERY_OFF = "AutoRecoveryDisabled"
    RESTART_BUDGET = "RestartBudgetExceeded"
    NON_FINITE_LOSS = "NonFiniteLossRepeated"
    FAILED_NODE_BUDGET = "FailedNodeBudgetExceeded"


class EventReason(enum.StrEnum):
    """The reasons of the Events the operator sends, but for a failed job's (`FailReason`) and
    a health condition's (its condition type)."""

    FAILURE_DIAGNOSED = "FailureDiagnosed"
    RESTARTING = "Restarting"
    RESUMED = "Resumed"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    PLACEMENT = "Placement"
    WAITING_FOR_POOL = "WaitingForPool"
    SHAPE_NOT_OFFERED = "ShapeNotOffered"
    NODE_TRUSTED_AGAIN = "NodeTrustedAgain"
    FAILED_CREATE = "FailedCreate"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    DEGRADED = "Degraded"
    """An elastic job's attempt runs on fewer slices than it asked for (`plan.elastic`)."""
    RESIZED = "Resized"
    """An elastic job restarts on more slices, a pool having freed (`plan.elastic`)."""
    QUEUE_LABEL_IGNORED = "QueueLabelIgnored"
    """The job's queue label changed after its Workload fixed its queue (`plan.queueing`)."""
    MORE_EVENTS = "MoreEvents"
    """One decision told more Events than its journal keeps: how many more, of which reasons."""


class TimelineKind(enum.StrEnum):
    """The kinds of the entries of `status.timeline` (`tpujob describe` shows them), but for a
    health condition's (its condition type)."""

    STARTED = "Started"
    PODS_CREATED = "PodsCreated"
    PLACEMENT = "Placement"
    FAILURE_SEEN = "FailureSeen"
    DIAGNOSED = "Diagnosed"
    RESTARTING = "Restarting"
    RESUMED = "Resumed"
    SUSPENDED = "Suspended"
    FORCE_DELETED = "ForceDeleted"
    SLICE_RESTART_ABANDONED = "SliceRestartAbandoned"
    SPARE_TAKEN = "SpareTaken"
    SPARE_USED = "SpareUsed"
    SPARE_RELEASED = "SpareReleased"
    DEGRADED = "Degraded"
    RESIZED = "Resized"
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
