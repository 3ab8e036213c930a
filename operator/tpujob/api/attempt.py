"""status.currentAttempt and status.failureHistory: the operator's journal of its decisions.

Part of the API layer (pydantic only). The operator records a decision here before it acts on
it (which pools the next attempt uses, when it may start, with which timeouts), so an operator
restarted at any moment finishes the recovery it had started instead of deciding anew.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from tpujob.api import constants as c
from tpujob.api.base import StatusModel

FAILURE_HISTORY_LIMIT = 20
ATTEMPT_HISTORY_LIMIT = 64


class SlicePlacement(StatusModel):
    """The node pool one slice of the current attempt runs on."""

    slice: int = Field(ge=0, le=c.MAX_SLICES, description="Slice index.")
    node_pool: str = Field(max_length=c.MAX_NAME_LENGTH, description="GKE node pool name.")


class KeptSlice(StatusModel):
    """A slice whose pods a slice restart kept: they rejoin this attempt in place."""

    slice: int = Field(ge=0, le=c.MAX_SLICES, description="Slice index.")
    pods_attempt: int = Field(
        ge=1,
        le=c.MAX_ATTEMPT,
        description="The attempt the kept pods were created for (their names carry it).",
    )


class AttemptStatus(StatusModel):
    """How the current attempt is run, decided when it was planned."""

    placement: tuple[SlicePlacement, ...] = Field(
        default=(), max_length=c.MAX_SLICES, description="Node pool per slice."
    )
    not_before: datetime | None = Field(
        default=None, description="The attempt's pods are created no earlier (medium backoff)."
    )
    launched_time: datetime | None = Field(
        default=None, description="When the attempt's pods were created."
    )
    collective_timeout_seconds: int | None = Field(
        default=None, ge=1, description="Collective and coordination timeout given the trainer."
    )
    graceful: bool = Field(
        default=False,
        description="The previous attempt's pods were given their full grace period to save.",
    )
    recovering_since: datetime | None = Field(
        default=None, description="When the failure that started this attempt was seen."
    )
    resumed_step: int | None = Field(
        default=None, ge=0, description="First step reported by this attempt's heartbeat."
    )
    memory_samples: tuple[MemorySampleStatus, ...] = Field(
        default=(),
        max_length=32,
        description="Host-memory readings of this attempt (HostMemoryGrowing's evidence).",
    )
    rollback_step: int | None = Field(
        default=None,
        ge=0,
        description="This attempt restores the newest checkpoint at or before this step "
        "(a rollback after a non-finite loss).",
    )
    restored_step: int | None = Field(
        default=None,
        ge=0,
        description="The committed checkpoint step known when the attempt launched: where it "
        "resumes from (goodput counts steps past it as re-done work of the attempt before).",
    )
    first_heartbeat_time: datetime | None = Field(
        default=None, description="When this attempt's first heartbeat was seen."
    )
    kept_slices: tuple[KeptSlice, ...] = Field(
        default=(),
        max_length=c.MAX_SLICES,
        description="Slices whose pods stay and rejoin this attempt in place (a slice "
        "restart); the others' pods are new.",
    )
    slices: int | None = Field(
        default=None,
        ge=1,
        le=c.MAX_SLICES,
        description="The slices this attempt runs on when fewer than spec.tpu.slices (an "
        "elastic job that found no pool for the others); unset when it runs on every slice.",
    )
    resizable: bool = Field(
        default=False,
        description="The attempt may launch on fewer slices than the job asks for (at least "
        "spec.elastic.minSlices) when pools are missing: it follows a failure or a resize of an "
        "elastic job, and keeps no pod in place.",
    )

    def slice_count(self, planned: int) -> int:
        """The slices the attempt runs on, of a job that asks for `planned`."""
        return self.slices if self.slices is not None else planned


class AttemptRecord(StatusModel):
    """An attempt that ended, as the goodput breakdown needs it (times: seconds since the
    job started)."""

    attempt: int = Field(ge=1, description="Attempt number.")
    launched: float = Field(ge=0, description="When its pods were created.")
    first_heartbeat: float | None = Field(default=None, ge=0, description="Its first heartbeat.")
    first_step: int | None = Field(default=None, ge=0, description="Step of that heartbeat.")
    restored_step: int | None = Field(default=None, ge=0, description="Where it resumed.")
    ended: float = Field(ge=0, description="When its failure or success was seen.")
    failed: bool = Field(default=False, description="It ended in a failure.")
    last_step: int | None = Field(default=None, ge=0, description="Last step it reported.")
    steps_per_second: float | None = Field(default=None, ge=0, description="Its last rate.")
    input_bound_fraction: float | None = Field(
        default=None, ge=0, le=1, description="Share of step time it waited for data."
    )
    checkpoint_step: int | None = Field(
        default=None, ge=0, description="Newest committed checkpoint when it ended."
    )
    slices: int | None = Field(
        default=None,
        ge=1,
        le=c.MAX_SLICES,
        description="The slices it ran on, when fewer than the job asked for.",
    )


class MemorySampleStatus(StatusModel):
    """One host-memory reading of the attempt, for the growth fit."""

    time: float = Field(ge=0, description="Seconds since the job started.")
    rss_bytes: int = Field(ge=0, description="Largest worker RSS, bytes.")
    step: int | None = Field(default=None, ge=0, description="Step of the health gather.")


class FailureRecord(StatusModel):
    """One earlier failure: the job's memory for the repeat guard and where failures recur."""

    signature: str = Field(max_length=256, description="Diagnosis signature.")
    code: str = Field(max_length=64, description="Failure code.")
    step: int | None = Field(default=None, ge=0, description="Training step at the failure.")
    node: str | None = Field(default=None, max_length=c.MAX_NAME_LENGTH, description="Node.")
    attempt: int | None = Field(default=None, ge=1, description="Attempt that failed.")
    slice: int | None = Field(default=None, ge=0, description="Slice of the root worker.")
    failure_class: str | None = Field(
        default=None, alias="class", max_length=16, description="Class it was graded."
    )
    memory_signature: str | None = Field(
        default=None,
        max_length=64,
        description="Code and normalised root message: equal across attempts, nodes, steps.",
    )
    progressed: bool | None = Field(
        default=None, description="The attempt reported training progress of its own."
    )
