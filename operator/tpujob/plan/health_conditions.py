"""The training's health in the job's conditions: input-bound, stragglers, host memory growth.

Pure; part of planning. Worker 0 publishes the workers' numbers on the heartbeat Lease (one
write per job however many hosts it has); `tpujob.observed.training` judges them. These
conditions inform and never restart anything, with one exception that is a grade, not a
restart: a host OOM kill that `HostMemoryGrowing` predicted is the leak it is.
"""

from __future__ import annotations

from tpujob import diagnosis as dx
from tpujob.api import ConditionStatus, ConditionType
from tpujob.api.attempt import MemorySampleStatus
from tpujob.api.reasons import ConditionReason, EventType
from tpujob.diagnosis.escalation import escalate
from tpujob.observed.training import (
    HealthCheck,
    HealthReason,
    HealthVerdicts,
    MemorySample,
    assess,
    next_memory_samples,
    parse_health,
    quantity_bytes,
)
from tpujob.observed.views import Observed, PodView
from tpujob.plan.result import Draft

CONDITION_OF = {
    HealthCheck.INPUT_BOUND: ConditionType.INPUT_BOUND,
    HealthCheck.STRAGGLER: ConditionType.STRAGGLER,
    HealthCheck.HOST_MEMORY_GROWING: ConditionType.HOST_MEMORY_GROWING,
}


def _finding(verdicts: HealthVerdicts, check: HealthCheck) -> tuple[HealthReason, str] | None:
    found = {
        HealthCheck.INPUT_BOUND: verdicts.input_bound,
        HealthCheck.STRAGGLER: verdicts.straggler,
        HealthCheck.HOST_MEMORY_GROWING: verdicts.host_memory_growing,
    }[check]
    return (found.reason, found.message) if found is not None else None


def watch_training_health(obs: Observed, draft: Draft, pods: tuple[PodView, ...]) -> None:
    """Set the health conditions from the current attempt's latest health report."""
    job, beat = obs.job, obs.heartbeat
    start = job.status.start_time
    if beat is None or beat.attempt != job.status.attempt or start is None:
        return
    hosts = job.spec.tpu.hosts_per_slice
    report = parse_health(
        beat.annotations,
        workers=job.status.current_attempt.slice_count(job.spec.tpu.slices) * hosts,
    )
    now = (draft.now - start).total_seconds()
    seen = (beat.renewed - start).total_seconds() if beat.renewed is not None else now
    current = draft.status.current_attempt
    before = tuple(MemorySample(s.time, s.rss_bytes, s.step) for s in current.memory_samples)
    samples = next_memory_samples(before, seen, report)
    if samples != before:
        draft.update(
            current_attempt=current.model_copy(
                update={
                    "memory_samples": tuple(
                        MemorySampleStatus(
                            time=round(s.time_seconds, 3), rss_bytes=s.max_rss_bytes, step=s.step
                        )
                        for s in samples
                    )
                }
            )
        )
    resources = job.spec.trainer.resources
    # The spec's memory is each worker's request and limit: what the OOM kill is projected to.
    limit = quantity_bytes(resources.memory) if resources is not None else None
    verdicts = assess(
        report,
        memory_samples=samples,
        memory_limit_bytes=limit,
        now_seconds=now,
        pods_by_process={p.slice * hosts + p.worker: (p.name, p.node or "") for p in pods},
    )
    for check in sorted(verdicts.assessed):
        kind, found = CONDITION_OF[check], _finding(verdicts, check)
        was = draft.status.condition(kind)
        if found is None:
            if was is not None and was.status == ConditionStatus.TRUE:
                draft.condition(kind, False, ConditionReason.HEALTHY)
            continue
        reason, message = found
        draft.condition(kind, True, reason, message)
        if was is None or was.status != ConditionStatus.TRUE:
            draft.timeline(kind, message)
            draft.event(EventType.WARNING, kind, message)


def grade_leak(d: dx.Diagnosis, obs: Observed) -> dx.Diagnosis:
    """A host OOM kill that HostMemoryGrowing warned of is a leak: the first is retried (the
    process starts small again), the same leak again fails the job with the evidence."""
    warned = obs.job.status.condition(ConditionType.HOST_MEMORY_GROWING)
    if (
        d.code is not dx.FailureCode.HOST_OOM
        or warned is None
        or warned.status != ConditionStatus.TRUE
    ):
        return d
    evidence = dx.Evidence(dx.Source.HEARTBEAT, f"predicted: {warned.message}")
    leaked_before = any(
        r.code == str(dx.FailureCode.HOST_OOM) and "leak" in (r.signature or "")
        for r in obs.job.status.failure_history
    )
    if leaked_before:
        return escalate(
            d,
            to=dx.FailureClass.FATAL,
            note=": host memory leaks, killed again as predicted",
            evidence=evidence,
            advice="find what keeps growing in the training process (caches of "
            "batches or compiled functions, metrics kept per step)",
        )
    return escalate(
        d,
        note=": a leak, as HostMemoryGrowing predicted",
        evidence=evidence,
        signature=f"{d.signature}:leak",
    )
