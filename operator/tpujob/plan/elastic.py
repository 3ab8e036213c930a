"""Elastic jobs (`spec.elastic.minSlices`): fewer slices instead of waiting, and back to all.

Pure, part of planning. A hard failure that leaves no usable pool for a slice would make a
multislice job wait, every chip it still holds idle. An elastic job's next attempt instead runs
on the slices that have a pool, if they are at least `minSlices`, and a later attempt grows back
to every slice once pools free. Decisions, where the spec is silent:

- Only after a failure or a resize (`AttemptStatus.resizable`). A new job, or one resumed from
  suspension or admitted by Kueue, waits for all its slices: starting small would take pools
  that whole jobs wait for, and Kueue admitted the whole job's quota.
- Only with `provisioning: ExistingPools`: under Autoscale a missing pool is being provisioned,
  and the slice's pods wait for it there.
- A change of the slice count replaces every pod. A kept pod's environment
  (MEGASCALE_NUM_SLICES, JAX_NUM_PROCESSES) cannot change in place, so an attempt that may be
  resized keeps no slice, and one that keeps slices is not resized.
- The slices of a smaller attempt are numbered 0..K-1 over the pools found, so the trainer sees
  an ordinary K-slice job; it is told the slices asked for (`TPUJOB_PLANNED_SLICES`) and keeps
  the global batch.
- Growing back is not a failure: no restart is counted and no budget spent. While the smaller
  attempt runs with every worker up and no trouble, pools for more slices (the job's own warm
  spares first, then free ones) start the next attempt on as many slices as have a pool; the
  old pods get their grace period to save (the trainer saves on SIGTERM) and the new attempt
  restores from that checkpoint. The pools are claimed when the decision is written, so no
  other job takes them while the old pods stop.
"""

from __future__ import annotations

from collections.abc import Mapping

from tpujob.api import ConditionType, Phase, TPUTrainingJob
from tpujob.api.attempt import AttemptStatus
from tpujob.api.enums import Provisioning
from tpujob.api.reasons import ConditionReason, EventReason, EventType, TimelineKind
from tpujob.observed.views import Observed
from tpujob.plan.failed_nodes import avoided_by
from tpujob.plan.goodput import ended_attempt
from tpujob.plan.placement import placement, pools_of
from tpujob.plan.pools import choose_pools
from tpujob.plan.result import Draft, PlannerSettings
from tpujob.plan.spares import spare_pools


def attempt_slices(job: TPUTrainingJob, current: AttemptStatus) -> int:
    """The slices an attempt runs on."""
    return current.slice_count(job.spec.tpu.slices)


def elastic(job: TPUTrainingJob) -> bool:
    """Whether the job may run on fewer slices than it asks for."""
    return (
        job.spec.elastic is not None
        and job.spec.tpu.provisioning is Provisioning.EXISTING_POOLS
        and job.spec.elastic.min_slices < job.spec.tpu.slices
    )


def fit_slices(
    job: TPUTrainingJob, current: AttemptStatus, pools: Mapping[int, str]
) -> tuple[dict[int, str], AttemptStatus]:
    """The pools and the attempt as launched: a resizable attempt of an elastic job runs on
    the slices that have a pool (numbered from 0) when they are at least `minSlices`.

    Otherwise, and when too few pools are left, both come back as they were asked: the
    attempt waits for a pool per slice, and is woken when one frees.
    """
    if not (current.resizable and elastic(job) and job.spec.elastic is not None):
        return dict(pools), current
    wanted = job.spec.tpu.slices
    if len(pools) < job.spec.elastic.min_slices:
        return dict(pools), current.model_copy(update={"slices": None})
    numbered = {i: pool for i, (_, pool) in enumerate(sorted(pools.items())[:wanted])}
    slices = len(numbered) if len(numbered) < wanted else None
    return numbered, current.model_copy(update={"slices": slices})


def say_degraded(obs: Observed, draft: Draft, slices: int) -> None:
    """Tell that the attempt launched on fewer slices than the job asks for."""
    job = obs.job
    assert job.spec.elastic is not None
    message = (
        f"attempt {job.status.attempt} runs on {slices} of {job.spec.tpu.slices} slices: no "
        f"usable pool for the others (elastic.minSlices {job.spec.elastic.min_slices}); it "
        "grows back when a pool frees"
    )
    draft.timeline(TimelineKind.DEGRADED, message)
    draft.event(EventType.WARNING, EventReason.DEGRADED, message)


def grow_back(obs: Observed, draft: Draft, settings: PlannerSettings) -> bool:
    """Plan the next attempt on more slices when the running smaller one can have them.

    True when it did. Called only for a running attempt with every worker up and no trouble.
    """
    job, now = obs.job, draft.now
    current = draft.status.current_attempt
    slices = attempt_slices(job, current)
    if slices >= job.spec.tpu.slices or draft.status.phase is not Phase.RUNNING:
        return False
    avoided = avoided_by(obs, now=now, return_after=settings.node_health.lost_node_return_seconds)
    pools = choose_pools(
        obs, pools_of(current), avoided, draft=draft, spares=spare_pools(obs), tell=False
    )
    if len(pools) <= slices:
        return False
    grown = len(pools)
    attempt = job.status.attempt + 1
    freed = sorted(set(pools.values()) - set(pools_of(current).values()))
    message = (
        f"attempt {attempt} on {grown} of {job.spec.tpu.slices} slices: "
        f"{', '.join(freed)} usable again; the trainers save first"
    )
    draft.update(
        attempt=attempt,
        phase=Phase.RECOVERING,
        attempt_history=ended_attempt(draft.status, obs.heartbeat, now=now, failed=False),
        current_attempt=AttemptStatus(
            placement=placement(pools),
            collective_timeout_seconds=current.collective_timeout_seconds,
            graceful=True,
            resizable=True,
            slices=grown if grown < job.spec.tpu.slices else None,
        ),
    )
    draft.condition(ConditionType.RUNNING, False, ConditionReason.RESIZING, message)
    draft.timeline(TimelineKind.RESIZED, message)
    draft.event(EventType.NORMAL, EventReason.RESIZED, message)
    draft.requeue(0.5)
    return True
