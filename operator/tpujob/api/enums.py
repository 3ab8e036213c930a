"""Closed sets of the TPUTrainingJob API as str enums.

Bottom layer, stdlib only. The values are what appears in YAML and in the CRD's `enum` lists.
"""

from __future__ import annotations

import enum


class Framework(enum.StrEnum):
    """The training framework the trainer runs; decides the coordination env wiring."""

    JAX = "jax"
    TENSORFLOW = "tensorflow"


class Provisioning(enum.StrEnum):
    """Where a job's slices find their node pools."""

    EXISTING_POOLS = "ExistingPools"
    """A slice launches only onto a free pool that exists; the job waits for one."""
    AUTOSCALE = "Autoscale"
    """A slice with no free pool launches anyway, pinned to no pool but kept whole in one pool
    of its own: the pending pods are the demand GKE's autoscaler provisions a pool for."""


class FailureClass(enum.StrEnum):
    """How a failure is treated, from cheapest to most severe."""

    SOFT = "soft"
    """Restart every worker in place from the latest checkpoint (preemption, a peer lost)."""
    MEDIUM = "medium"
    """Recreate the slice's pods after a backoff (timeouts, host OOM, checkpoint I/O)."""
    HARD = "hard"
    """Mark the node bad and reschedule the slice elsewhere (device or node faults)."""
    FATAL = "fatal"
    """Fail the job now: retrying cannot help (configuration or user code errors)."""

    @property
    def retrying(self) -> bool:
        return self is not FailureClass.FATAL


class BadNodeAction(enum.StrEnum):
    """What the operator does to a node blamed for a hard failure."""

    TAINT = "taint"
    CORDON = "cordon"
    NONE = "none"


class Phase(enum.StrEnum):
    """The job's lifecycle phase, as shown by `kubectl get tpujobs`."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"

    @property
    def finished(self) -> bool:
        """Whether the phase is terminal (the TTL clock starts)."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionStatus(enum.StrEnum):
    """The standard Kubernetes condition status values."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(enum.StrEnum):
    """Condition types the operator sets on a job (status.conditions[].type)."""

    SPEC_VALID = "SpecValid"
    """False when the spec passed admission but the operator cannot run it (see message)."""
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    PODS_REFUSED = "PodsRefused"
    """True while the apiserver refuses the attempt's pods (quota, admission, Pod Security)."""
    INPUT_BOUND = "InputBound"
    """True while the workers spend more than a threshold of step time waiting for data."""
    STRAGGLER = "Straggler"
    """True while one worker is consistently slower than its peers (names its node)."""
    HOST_MEMORY_GROWING = "HostMemoryGrowing"
    """True while a worker's host memory grows towards its limit (projected time given)."""
    HEARTBEAT = "Heartbeat"
    """True once the trainer announced the heartbeat contract (a hang is then detected);
    False with why when it is not judged by its heartbeat."""
    PLANNING_SLOW = "PlanningSlow"
    """True when planning the job (its diagnosis included) overran the operator's budget."""
    CHECKPOINT_CADENCE = "CheckpointCadence"
    """Whether spec.checkpoint.intervalSteps is near the Young/Daly optimum for the measured
    save cost and the job's time between failures (the message gives the optimum)."""
    SHAPE_OFFERED = "ShapeOffered"
    """False when the operator's Cloud TPU zone catalogue offers the job's accelerator and
    topology in none of its zones (advice only: the job still runs where a pool exists)."""
