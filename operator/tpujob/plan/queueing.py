"""Queueing through Kueue: a job that names a queue runs only while Kueue admits it.

Pure, part of planning. The operator is the job's integration with Kueue, as Kueue's own job
framework is for the kinds it knows (the Kueue configuration lists `TPUTrainingJob` among its
`externalFrameworks`):

* it represents the job to Kueue as a `Workload` owned by the job, with one pod set per slice
  (the chips, CPU and memory of its pods, their node selectors and tolerations) and the job's
  priority;
* it keeps the job's pods from existing until Kueue admits the Workload (`hold`): the job shows
  `Suspended` with "waiting for admission in queue Q". `spec.suspend` stays the user's: the
  operator never writes a job's spec (GitOps tools would revert it, and a user's suspend must
  not be lifted by an admission);
* on admission, the slices are placed only on pools whose nodes carry the node labels of the
  ResourceFlavors Kueue assigned;
* on an eviction (a preemption, a PodsReady timeout, a deactivation) the pods are stopped
  gracefully (SIGTERM: the trainer saves), and once none is left the Workload's admission is
  cleared, which gives the quota back and requeues it; admitted again, the job resumes from
  its checkpoint as after a suspend;
* it tells Kueue when every pod of the attempt runs (`PodsReady`, for `waitForPodsReady`) and
  when the job has finished (`Finished`), which releases the quota;
* a user's `spec.suspend: true` deactivates the Workload (`spec.active: false`), so a
  suspended job holds no quota;
* it publishes, on a running job's Workload, the work a preemption would throw away (the
  steps since its last committed checkpoint at the measured rate) and a priority boost from
  it (`kueue.x-k8s.io/priority-boost`, read by Kueue with its PriorityBoost gate on): among
  jobs of one priority, the one that saved last is preempted first.

Kueue's topology assignments and admission checks' pod set updates are not applied (the
operator's own pool placement gives each slice a whole pool); flavors' tolerations neither
(trainer pods already tolerate the TPU taint).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from tpujob.api import TPUTrainingJob, labels
from tpujob.api.constants import MAX_MESSAGE_LENGTH
from tpujob.api.enums import Phase
from tpujob.api.reasons import EventReason, EventType, TimelineKind
from tpujob.api.status import QueueStatus
from tpujob.observed.admission import (
    ADMITTED,
    FINISHED,
    PODS_READY,
    PRIORITY_BOOST,
    QUOTA_RESERVED,
    REQUEUED,
    REQUEUED_AT_ONCE,
    WORK_SINCE_CHECKPOINT,
    PodSetUpdate,
    WorkloadCondition,
    WorkloadView,
)
from tpujob.observed.views import Observed
from tpujob.plan import manifests
from tpujob.plan.result import Draft, WorkloadPriority, WorkloadWrite

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
# A Workload's priority from a WorkloadPriorityClass, as Kueue's own integrations read it.
PRIORITY_CLASS_LABEL = f"{KUEUE_GROUP}/priority-class"
# The kinds of class a Workload's priority comes from.
WORKLOAD_PRIORITY_CLASS = "WorkloadPriorityClass"
POD_PRIORITY_CLASS = "PriorityClass"
# The checkpoint-aware priority boost (`_boost`): a point per `preemption_boost_seconds` of work
# at risk (the operator's setting, a minute by default), at most this.
MAX_BOOST = 10
# Kueue's limit on pod sets per Workload; a job with more slices is one pod set of them all.
MAX_POD_SETS = 8


def queue_of(job: TPUTrainingJob) -> str | None:
    """The LocalQueue the job names, or None: the job is not queued through Kueue."""
    value = (job.metadata.get("labels") or {}).get(labels.QUEUE_NAME)
    return str(value) if value else None


def queue_for(obs: Observed) -> str | None:
    """The queue the job is in now, or None: not queued through Kueue.

    A job's Workload fixes its queue once it exists: a queue label changed or removed while the
    Workload holds quota leaves the job in that queue until it ends or is evicted (stopping a
    running job, or letting it run outside any quota, would both be worse; Kueue's own
    integrations refuse the change on a running job). A label removed while the job waits
    takes it out of the queue (`sync_workload` deactivates the Workload); a label changed while
    it waits leaves it where it waits (see `label_ignored`).
    """
    label = queue_of(obs.job)
    wl = obs.workload
    if wl is None or not obs.queueing or wl.queue_name is None:
        return label
    if wl.quota_reserved or label is not None:
        return wl.queue_name
    return label


def label_ignored(obs: Observed) -> str | None:
    """What the job's queue label asks that its Workload does not follow, or None."""
    label, queue = queue_of(obs.job), queue_for(obs)
    if queue is None or label == queue:
        return None
    asked = f"the label asks for queue {label}" if label else "the queue label was removed"
    return (
        f"{asked}; the job stays in queue {queue}, where its Workload "
        + ("holds quota, until it ends or is evicted" if label is None else "is")
        + " (a job's queue is fixed once it is queued: re-create the job to move it)"
    )


def workload_name(job: TPUTrainingJob) -> str:
    """One per incarnation of the job (the uid's hash), so a job re-applied under its old name
    never inherits the old one's admission."""
    uid = str(job.metadata.get("uid") or "")
    digest = hashlib.sha256(uid.encode()).hexdigest()[:8]
    return f"tpujob-{job.name[:200]}-{digest}"


def _pod_set_template(job: TPUTrainingJob) -> dict[str, Any]:
    """What Kueue reads of a slice's pods: requests, node selectors, tolerations, priority."""
    pod = manifests.trainer_pod(job, manifests.AttemptSettings(attempt=1, pools={}), 0, 0)
    spec = pod["spec"]
    container = spec["containers"][0]
    kept = {
        k: spec[k]
        for k in ("nodeSelector", "tolerations", "priorityClassName", "affinity")
        if spec.get(k)
    }
    return {
        "spec": {
            **kept,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": container["name"],
                    "image": container["image"],
                    "resources": container.get("resources") or {},
                }
            ],
        }
    }


def pod_set_name(job: TPUTrainingJob, slice_index: int) -> str:
    """The Workload's pod set a slice's pods belong to: one per slice, up to Kueue's limit."""
    return f"slice-{slice_index}" if job.spec.tpu.slices <= MAX_POD_SETS else "slices"


def pod_set_updates(obs: Observed) -> dict[int, PodSetUpdate]:
    """Slice -> what the admission checks of the job's admitted Workload ask of its pods."""
    wl = obs.workload
    if wl is None or not wl.admitted or not wl.pod_set_updates:
        return {}
    found = {
        s: wl.pod_set_updates.get(pod_set_name(obs.job, s)) for s in range(obs.job.spec.tpu.slices)
    }
    return {s: update for s, update in found.items() if update is not None}


def workload_manifest(job: TPUTrainingJob) -> dict[str, Any]:
    """The Workload that stands for the job in its queue (priority filled in by the shell)."""
    tpu = job.spec.tpu
    template = _pod_set_template(job)
    if tpu.slices <= MAX_POD_SETS:
        pod_sets = [
            {"name": pod_set_name(job, s), "count": tpu.hosts_per_slice, "template": template}
            for s in range(tpu.slices)
        ]
    else:
        pod_sets = [{"name": pod_set_name(job, 0), "count": tpu.total_hosts, "template": template}]
    meta = manifests.child_meta(job, workload_name(job))
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": meta,
        "spec": {"queueName": queue_of(job), "podSets": pod_sets, "active": not job.spec.suspend},
    }


def workload_priority(job: TPUTrainingJob) -> WorkloadPriority | None:
    """Which priority class the Workload takes its priority from: Kueue's label first, as in
    Kueue's integrations, else the trainer pods' PriorityClass."""
    name = (job.metadata.get("labels") or {}).get(PRIORITY_CLASS_LABEL)
    if name:
        return WorkloadPriority(KUEUE_GROUP, WORKLOAD_PRIORITY_CLASS, str(name))
    template = job.spec.trainer.pod_template
    pod_class = template.spec.priority_class_name if template is not None else None
    if pod_class:
        return WorkloadPriority("scheduling.k8s.io", POD_PRIORITY_CLASS, pod_class)
    return None


def hold(obs: Observed) -> tuple[TimelineKind, str] | None:
    """Why a job that names a queue may not run now, or None when it may (or names none)."""
    queue = queue_for(obs)
    if queue is None:
        return None
    wl = obs.workload
    if not obs.queueing:
        return TimelineKind.QUEUED, (
            f"names Kueue queue {queue}, but this operator's Kueue integration is off "
            "(tpujob operator --kueue; the chart's kueue.enabled): it waits, never bypassing "
            "the queue"
        )
    if wl is not None and (evicted := wl.evicted) is not None:
        return TimelineKind.EVICTED, _eviction(evicted)
    if wl is None or not wl.admitted:
        return TimelineKind.QUEUED, f"waiting for admission in queue {queue}"
    return None


def _eviction(evicted: WorkloadCondition) -> str:
    said = f": {evicted.message}" if evicted.message else ""
    return f"evicted by Kueue ({evicted.reason or 'Evicted'}){said}"[:MAX_MESSAGE_LENGTH]


def track(obs: Observed, draft: Draft) -> None:
    """Keep `status.queue` and the timeline up to date with Kueue's decisions."""
    job, now = obs.job, draft.now
    queue = queue_for(obs)
    if job.status.phase in (Phase.SUCCEEDED, Phase.FAILED):
        return
    if queue is None:
        if job.status.queue is not None:
            message = (
                f"left queue {job.status.queue.name}: its queue label was removed while it waited; "
                "the job runs without a queue"
            )
            draft.update(queue=None)
            draft.timeline(TimelineKind.QUEUED, message)
            draft.event(EventType.NORMAL, EventReason.QUEUED, message)
        return
    ignored = label_ignored(obs)
    if ignored is not None and not any(e.message == ignored for e in draft.status.timeline):
        draft.timeline(TimelineKind.QUEUED, ignored)
        draft.event(EventType.WARNING, EventReason.QUEUE_LABEL_IGNORED, ignored)
    wl = obs.workload
    before = job.status.queue or QueueStatus(name=queue)
    runs = obs.queueing and wl is not None and wl.admitted and wl.evicted is None
    after = before.model_copy(
        update={
            "name": queue,
            "workload": wl.name if wl is not None else workload_name(job),
            "cluster_queue": wl.cluster_queue if runs and wl is not None else None,
            "admitted": runs,
        }
    )
    if runs and not before.admitted:
        after = after.model_copy(
            update={
                "waiting_since": None,
                "queued_seconds": before.queued_seconds + _waited(before, job, now),
            }
        )
        message = f"admitted by ClusterQueue {after.cluster_queue}"
        if wl is not None and wl.flavors:
            flavors = sorted({f for names in wl.flavors.values() for f in names})
            message += f" (flavors {', '.join(flavors)})"
        draft.timeline(TimelineKind.ADMITTED, message)
        draft.event(EventType.NORMAL, EventReason.ADMITTED, message)
    elif not runs and (before.admitted or before.waiting_since is None):
        after = after.model_copy(update={"waiting_since": now})
        evicted = wl.evicted if wl is not None else None
        if before.admitted and evicted is not None:
            message = _eviction(evicted)
            after = after.model_copy(
                update={"evictions": before.evictions + 1, "last_eviction": message}
            )
            draft.timeline(TimelineKind.EVICTED, f"{message}; stopping gracefully to requeue")
            draft.event(EventType.WARNING, EventReason.EVICTED, message)
        else:
            said = hold(obs)
            message = said[1] if said is not None else f"waiting for admission in queue {queue}"
            draft.timeline(TimelineKind.QUEUED, message)
            draft.event(EventType.NORMAL, EventReason.QUEUED, message)
    if after != job.status.queue:
        draft.update(queue=after)


def _waited(before: QueueStatus, job: TPUTrainingJob, now: datetime) -> float:
    """Seconds of the wait that ends now that count in the job's wall time (after its start)."""
    start = job.status.start_time
    if before.waiting_since is None or start is None:
        return 0.0
    return max(0.0, (now - max(before.waiting_since, start)).total_seconds())


def sync_workload(obs: Observed, draft: Draft, *, boost_seconds: float) -> None:
    """What the job's Workload must be told, as one write (`Draft.workload`)."""
    job = obs.job
    if not obs.queueing:
        return
    wl = obs.workload
    if queue_for(obs) is None:
        if wl is not None and wl.active:
            # Taken out of its queue while waiting: the Workload must never be admitted.
            draft.workload = WorkloadWrite(
                name=wl.name, resource_version=wl.resource_version, active=False
            )
        return
    terminal = draft.status.phase in (Phase.SUCCEEDED, Phase.FAILED)
    if wl is None:
        if not terminal:
            draft.workload = WorkloadWrite(
                name=workload_name(job),
                create=workload_manifest(job),
                priority=workload_priority(job),
            )
        return
    conditions = {c.type: c for c in wl.conditions}
    changed: list[WorkloadCondition] = []
    clear = False
    if terminal and not wl.finished:
        succeeded = draft.status.phase is Phase.SUCCEEDED
        reason = "Succeeded" if succeeded else "Failed"
        changed.append(_condition(FINISHED, True, reason, f"the job {reason.lower()}", draft.now))
    elif not terminal and (evicted := wl.evicted) is not None and wl.quota_reserved:
        if not any(not p.terminal for p in obs.pods):
            # Stopped: give the quota back and let Kueue requeue it.
            clear = True
            message = evicted.message or evicted.reason
            changed.append(_condition(QUOTA_RESERVED, False, "Pending", message, draft.now))
            changed.append(_condition(ADMITTED, False, "NoReservation", message, draft.now))
            requeued = evicted.reason in REQUEUED_AT_ONCE
            changed.append(_condition(REQUEUED, requeued, evicted.reason, message, draft.now))
    elif not terminal and wl.admitted and wl.evicted is None:
        ready = _pods_ready(obs, draft)
        if ready is not None:
            changed.append(ready)
    changed = [c for c in changed if not _same(conditions.get(c.type), c)]
    active = not job.spec.suspend
    annotations = _boost(obs, draft, wl, boost_seconds)
    if not changed and not clear and wl.active == active and annotations is None:
        return
    merged = {**conditions, **{c.type: c for c in changed}}
    draft.workload = WorkloadWrite(
        name=wl.name,
        resource_version=wl.resource_version,
        active=active if wl.active != active else None,
        annotations=annotations,
        conditions=tuple(c.as_dict() for c in merged.values()) if changed else None,
        clear_admission=clear,
    )


def work_at_risk(obs: Observed, draft: Draft) -> float | None:
    """Seconds of training a preemption now would throw away: the steps since the last
    committed checkpoint at the measured rate; None when the job is not training."""
    beat = obs.heartbeat
    if (
        draft.status.phase is not Phase.RUNNING
        or beat is None
        or beat.attempt != draft.status.attempt
        or beat.step is None
        or not beat.steps_per_second
    ):
        return None
    saved = beat.checkpoint_step or 0
    return max(0, beat.step - saved) / beat.steps_per_second


def _boost(
    obs: Observed, draft: Draft, wl: WorkloadView, boost_seconds: float
) -> dict[str, str | None] | None:
    """The checkpoint-aware priority boost, when it changes: a running job gains a point per
    `boost_seconds` of work a preemption would lose (at most `MAX_BOOST`, so a boost never
    lifts a job past a priority class set `MAX_BOOST` + 1 apart), so among jobs of one
    priority Kueue preempts the one that saved last first. A job not running has none."""
    risk = work_at_risk(obs, draft) if wl.admitted and wl.evicted is None else None
    if risk is None:
        if wl.boost is None:
            return None
        return {PRIORITY_BOOST: None, WORK_SINCE_CHECKPOINT: None}
    boost = min(MAX_BOOST, int(risk // boost_seconds))
    if wl.boost == boost:
        return None
    return {PRIORITY_BOOST: str(boost), WORK_SINCE_CHECKPOINT: str(int(risk))}


def _pods_ready(obs: Observed, draft: Draft) -> WorkloadCondition | None:
    """PodsReady as Kueue's `waitForPodsReady` reads it: every worker of the attempt runs."""
    status = draft.status
    if status.attempt < 1:
        return None
    pods = obs.attempt_pods(status.attempt)
    hosts = obs.job.spec.tpu.total_hosts
    running = sum(1 for p in pods if p.running and not p.terminal and p.deleting_since is None)
    ever = status.current_attempt.first_heartbeat_time is not None or len(status.attempt_history)
    if running >= hosts:
        reason = "Recovered" if ever and status.attempt > 1 else "Started"
        return _condition(PODS_READY, True, reason, "every worker runs", draft.now)
    reason = "WaitForRecovery" if status.attempt > 1 else "WaitForStart"
    return _condition(PODS_READY, False, reason, f"{running} of {hosts} workers run", draft.now)


def _condition(
    kind: str, value: bool, reason: str, message: str, now: datetime
) -> WorkloadCondition:
    return WorkloadCondition(
        type=kind,
        status="True" if value else "False",
        reason=reason or kind,
        message=message[:MAX_MESSAGE_LENGTH],
        last_transition_time=now,
    )


def _same(old: WorkloadCondition | None, new: WorkloadCondition) -> bool:
    return old is not None and (old.status, old.reason) == (new.status, new.reason)
