"""The statuses a reconcile reports when it cannot plan: a spec the operator cannot run, a
plan that overran its budget, pods the apiserver refused.

Pure; part of what the operator decides, like `planner.plan`, so that every status it writes
is built in this wing and the shell only writes it. Each returns None when the status already
says the same, so a retry writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from tpujob.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    FieldError,
    Phase,
    TPUTrainingJobStatus,
    status_patch,
)
from tpujob.api.reasons import ConditionReason, EventReason, EventType
from tpujob.plan.result import EventSpec

# A refusal or an overrun is said in a line; a spec's errors may be many.
REPORT_MESSAGE_LIMIT = 1000
INVALID_SPEC_MESSAGE_LIMIT = 4000


def _with(
    status: TPUTrainingJobStatus,
    kind: ConditionType,
    value: bool,
    reason: ConditionReason,
    message: str,
    *,
    now: datetime,
) -> TPUTrainingJobStatus:
    return status.with_condition(
        Condition(
            type=kind,
            status=ConditionStatus.TRUE if value else ConditionStatus.FALSE,
            reason=reason,
            message=message,
            last_transition_time=now,
        )
    )


def _changed(old: TPUTrainingJobStatus, new: TPUTrainingJobStatus) -> TPUTrainingJobStatus | None:
    return new if status_patch(new) != status_patch(old) else None


def pods_refused(
    status: TPUTrainingJobStatus, refusal: str, *, now: datetime
) -> tuple[TPUTrainingJobStatus, EventSpec] | None:
    """PodsRefused=True naming why the apiserver refuses the attempt's pods, and its Event;
    None when the condition already says so (a retry tells nothing new)."""
    message = refusal[:REPORT_MESSAGE_LIMIT]
    previous = status.condition(ConditionType.PODS_REFUSED)
    if (
        previous is not None
        and previous.status == ConditionStatus.TRUE
        and previous.message == message
    ):
        return None
    new = _with(
        status, ConditionType.PODS_REFUSED, True, ConditionReason.FAILED_CREATE, message, now=now
    )
    return new, EventSpec(EventType.WARNING, EventReason.FAILED_CREATE, message)


def planning_slow(
    status: TPUTrainingJobStatus,
    *,
    budget_seconds: float,
    retry_seconds: float,
    patterns: Sequence[str],
    now: datetime,
) -> TPUTrainingJobStatus:
    """PlanningSlow=True: planning overran its budget; the user's own patterns are named, as
    the likeliest cause."""
    message = (
        f"planning this job took longer than {budget_seconds:.0f}s and was "
        f"abandoned; it is retried in {retry_seconds:.0f}s"
    )
    if patterns:
        message += "; spec.recovery.rules patterns: " + ", ".join(repr(p) for p in patterns)
    return _with(
        status,
        ConditionType.PLANNING_SLOW,
        True,
        ConditionReason.PLANNING_BUDGET_EXCEEDED,
        message[:REPORT_MESSAGE_LIMIT],
        now=now,
    )


def invalid_spec(
    status: TPUTrainingJobStatus, errors: Sequence[FieldError], *, now: datetime
) -> TPUTrainingJobStatus | None:
    """SpecValid=False naming each field the operator cannot run, the job Pending (a finished
    job keeps its phase: what it did is history, whatever its spec says now); None when the
    status already says so."""
    message = "; ".join(f"{e.path}: {e.message}" for e in errors)[:INVALID_SPEC_MESSAGE_LIMIT]
    new = _with(
        status, ConditionType.SPEC_VALID, False, ConditionReason.INVALID_SPEC, message, now=now
    )
    if status.phase not in (Phase.SUCCEEDED, Phase.FAILED):
        new = new.model_copy(update={"phase": Phase.PENDING})
    return _changed(status, new)


def waits_for_pool(status: TPUTrainingJobStatus) -> bool:
    """The job runs nowhere yet because some slice has no free pool of its shape, or runs
    on fewer slices than it asks for (an elastic job, `tpujob.plan.elastic`) until one frees."""
    if status.phase in (Phase.SUCCEEDED, Phase.FAILED):
        return False
    if status.current_attempt.slices is not None:
        return True
    running = status.condition(ConditionType.RUNNING)
    return running is not None and running.reason == ConditionReason.WAITING_FOR_POOL
