"""plan(observed, now) -> Plan: the whole reconcile decision for one job, as a pure function.

The job's life: a new job gets attempt 1 with a pool per slice; an attempt is launched (its
pods created) once its backoff has passed and the previous attempt's pods have gone; a launched
attempt is watched for success, failure and hangs; a failure is diagnosed and either fails the
job or plans the next attempt (see `tpujob.plan.recovery`). Reads no clock and does no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from tpujob.api import ConditionStatus, ConditionType, Phase, Progress, TPUTrainingJob
from tpujob.api import constants as c
from tpujob.api.attempt import AttemptStatus
from tpujob.api.reasons import ConditionReason, EventReason, EventType, FailReason, TimelineKind
from tpujob.gcp.catalogue import FindingLevel, check_shape
from tpujob.observed.nodes import lost
from tpujob.observed.trouble import find_trouble
from tpujob.observed.views import Observed, PodView
from tpujob.plan import manifests, queueing
from tpujob.plan.checkpoint_cadence import say_checkpoint_cadence
from tpujob.plan.deadlines import pace
from tpujob.plan.elastic import attempt_slices, fit_slices, grow_back, say_degraded
from tpujob.plan.failed_nodes import avoided_by
from tpujob.plan.failure import handle_failure
from tpujob.plan.goodput import breakdown, ended_attempt, goodput_of
from tpujob.plan.health_conditions import watch_training_health
from tpujob.plan.heartbeat_condition import watch_heartbeat
from tpujob.plan.marks import mark_blamed_nodes
from tpujob.plan.placement import placement, pools_of
from tpujob.plan.pod_security import hostpath_allowed
from tpujob.plan.pools import choose_pools
from tpujob.plan.provisioning import learn_pools, say_no_free_pool, unplaced
from tpujob.plan.recovery import no_attempt_left
from tpujob.plan.result import Draft, Plan, PlannerSettings, PodDeletion
from tpujob.plan.slices import abandon_if_broken, is_kept, kept_pods, rejoin
from tpujob.plan.spares import keep_spares, release_spares, spare_pools
from tpujob.plan.starting import say_pods_not_starting

TERMINAL = (Phase.SUCCEEDED, Phase.FAILED)
FINISHED_POLL_SECONDS = 3600.0
# A job waiting for a pool is woken when one is freed (its holder's pods end or go, its
# claim is let go, a node of an unheld pool turns healthy): this poll is only the net under
# those wakes. At 5 s, a thousand queued jobs cost 200 reconciles a second doing nothing.
WAIT_FOR_POOL_SECONDS = 30.0


DEFAULT_SETTINGS = PlannerSettings()
# A refused spec changes only when its job does, which wakes the job at once.
REFUSED_SPEC_POLL_SECONDS = 300.0
# Phases whose job is looked at by its deadlines when nothing about it is in motion
# (`tpujob.plan.deadlines`); the others keep the short poll.
_PACED = frozenset({Phase.STARTING, Phase.RUNNING})


def plan(obs: Observed, *, now: datetime, settings: PlannerSettings = DEFAULT_SETTINGS) -> Plan:
    job = obs.job
    draft = Draft(status=job.status, now=now, requeue_after=settings.poll_seconds)
    draft.update(observed_generation=job.metadata.get("generation"))
    draft.condition(ConditionType.SPEC_VALID, True, ConditionReason.VALID)
    slow = job.status.condition(ConditionType.PLANNING_SLOW)
    if slow is not None and slow.status == ConditionStatus.TRUE:
        draft.condition(ConditionType.PLANNING_SLOW, False, ConditionReason.WITHIN_BUDGET)
    if job.status.phase not in TERMINAL:
        _shape_offered(obs, draft)
        queueing.track(obs, draft)
    if job.status.phase in TERMINAL:
        # A finished job is woken by changes to its own pods; nothing else is worth a poll.
        draft.requeue_after = FINISHED_POLL_SECONDS
        _finished(obs, draft, settings)
    elif job.spec.suspend:
        _suspend(obs, draft, ConditionReason.SUSPENDED, "spec.suspend is true")
    elif (held := queueing.hold(obs)) is not None:
        _suspend(obs, draft, _HELD_REASONS[held[0]], held[1])
    elif job.status.attempt == 0 and (refused := refused_host_path(job, settings)) is not None:
        # Never launched: its pods would mount a node path the operator may not give out.
        # A job already running keeps running (narrowed prefixes do not stop it).
        draft.condition(ConditionType.SPEC_VALID, False, ConditionReason.INVALID_SPEC, refused)
        draft.update(phase=Phase.PENDING)
        draft.requeue_after = REFUSED_SPEC_POLL_SECONDS
    elif job.status.phase is Phase.SUSPENDED and job.status.attempt >= c.MAX_ATTEMPT:
        _no_attempt_left(obs, draft)
    elif job.status.attempt == 0 or job.status.phase is Phase.SUSPENDED:
        _new_attempt_after_start_or_resume(obs, draft, settings)
        # Launched in the same reconcile: the status planning the attempt is written before
        # any of its pods exist, as a later reconcile's launch would be. A second round per
        # job would queue the first launch of a burst behind every job's first reconcile.
        _reconcile_attempt(_with_status(obs, draft), draft, settings)
    else:
        _reconcile_attempt(obs, draft, settings)
    mark_blamed_nodes(obs, draft, settings)
    queueing.sync_workload(obs, draft, boost_seconds=settings.preemption_boost_seconds)
    if job.status.phase in _PACED and draft.status.phase is job.status.phase:
        # Last: whether the job is in motion depends on every effect planned above.
        pace(obs, draft, settings)
    parts = breakdown(draft.status, obs.heartbeat, now=now)
    if parts is not None:
        draft.update(goodput_breakdown=parts, goodput=goodput_of(parts))
        if draft.status.phase is Phase.RUNNING:
            say_checkpoint_cadence(obs, draft, parts)
    return draft.done()


def refused_host_path(job: TPUTrainingJob, settings: PlannerSettings) -> str | None:
    """Why the job's hostPath checkpoint may not be mounted, or None when it may (or the
    operator was given no prefixes to check it against)."""
    volume = job.spec.checkpoint.volume if job.spec.checkpoint is not None else None
    prefixes = settings.host_path_prefixes
    if volume is None or volume.host_path is None or prefixes is None:
        return None
    if hostpath_allowed(volume.host_path, prefixes):
        return None
    allowed = ", ".join(prefixes) or "none"
    return (
        f"spec.checkpoint.volume.hostPath: {volume.host_path} is not under a path the operator "
        f"may give out (--host-path-prefixes, the chart's hostPathPrefixes: {allowed})"
    )


def _with_status(obs: Observed, draft: Draft) -> Observed:
    """`obs` as the next reconcile would see it once the draft's status is written."""
    return replace(obs, job=obs.job.model_copy(update={"status": draft.status}))


def _shape_offered(obs: Observed, draft: Draft) -> None:
    """The zone catalogue's word on the job's shape, as a condition (and an Event when it
    turns to "offered nowhere"). Advice only; without a readable catalogue it says nothing and
    leaves what it said before."""
    tpu = obs.job.spec.tpu
    check = check_shape(obs.catalogue, tpu.accelerator, tpu.topology)
    if check.level is FindingLevel.INFO:
        return
    offered = check.level is FindingLevel.OK
    before = obs.job.status.condition(ConditionType.SHAPE_OFFERED)
    draft.condition(
        ConditionType.SHAPE_OFFERED,
        offered,
        ConditionReason.OFFERED if offered else ConditionReason.NOT_OFFERED,
        check.message,
    )
    if not offered and (before is None or before.status != ConditionStatus.FALSE):
        draft.event(EventType.WARNING, EventReason.SHAPE_NOT_OFFERED, check.message)


def _new_attempt_after_start_or_resume(
    obs: Observed, draft: Draft, settings: PlannerSettings
) -> None:
    job, now = obs.job, draft.now
    resuming = job.status.phase is Phase.SUSPENDED
    pools = choose_pools(
        obs,
        pools_of(job.status.current_attempt) if resuming else {},
        avoided_by(obs, now=now, return_after=settings.node_health.lost_node_return_seconds),
        draft=draft,
    )
    attempt = job.status.attempt + 1
    draft.update(
        attempt=attempt,
        phase=Phase.STARTING,
        start_time=job.status.start_time or now,
        failed_node_budget=job.spec.max_failed_nodes_count(),
        failed_node_budget_left=job.spec.max_failed_nodes_count() - len(job.status.failed_nodes),
        current_attempt=AttemptStatus(
            placement=placement(pools),
            collective_timeout_seconds=job.status.current_attempt.collective_timeout_seconds,
        ),
    )
    draft.condition(
        ConditionType.SUSPENDED,
        False,
        ConditionReason.RESUMED if resuming else ConditionReason.NOT_SUSPENDED,
    )
    draft.timeline(
        TimelineKind.RESUMED if resuming else TimelineKind.STARTED, f"attempt {attempt} planned"
    )


def _no_attempt_left(obs: Observed, draft: Draft) -> None:
    """A suspended job at the last attempt it may have fails instead of resuming: attempt + 1
    could not be watched, nor (past int64) written. See `recovery.no_attempt_left`."""
    message = no_attempt_left(obs.job, "resumed")
    draft.update(phase=Phase.FAILED, completion_time=draft.now)
    draft.condition(ConditionType.FAILED, True, FailReason.RESTART_BUDGET, message)
    draft.condition(ConditionType.SUSPENDED, False, FailReason.RESTART_BUDGET)
    draft.timeline(TimelineKind.FAILED, message)
    draft.event(EventType.WARNING, FailReason.RESTART_BUDGET, message)


_HELD_REASONS = {
    TimelineKind.QUEUED: ConditionReason.WAITING_FOR_ADMISSION,
    TimelineKind.EVICTED: ConditionReason.EVICTED,
}


def _suspend(obs: Observed, draft: Draft, reason: ConditionReason, why: str) -> None:
    """Stop the job's pods gracefully (the trainer saves on SIGTERM) and keep its status:
    suspended by its user, or held by its Kueue queue (`tpujob.plan.queueing`)."""
    for pod in obs.pods:
        if not pod.terminal and pod.deleting_since is None:
            draft.delete_pods.append(PodDeletion(pod.name, pod.uid, None))
    release_spares(obs, draft)
    if obs.job.status.phase is not Phase.SUSPENDED:
        draft.update(
            phase=Phase.SUSPENDED,
            current_attempt=AttemptStatus(placement=obs.job.status.current_attempt.placement),
        )
        draft.condition(ConditionType.RUNNING, False, ConditionReason.SUSPENDED)
        if reason is ConditionReason.SUSPENDED:
            draft.timeline(TimelineKind.SUSPENDED, "pods stopped; the status is kept")
            draft.event(EventType.NORMAL, EventReason.SUSPENDED, f"{why}: pods stopped")
    draft.condition(ConditionType.SUSPENDED, True, reason, why)


def _finished(obs: Observed, draft: Draft, settings: PlannerSettings) -> None:
    for pod in obs.pods:
        if not pod.terminal and pod.deleting_since is None:
            draft.delete_pods.append(PodDeletion(pod.name, pod.uid, settings.restart_grace_seconds))
    release_spares(obs, draft)
    ttl = obs.job.spec.ttl_seconds_after_finished
    done = obs.job.status.completion_time
    if ttl is not None and done is not None:
        # Counted in seconds, not as a time: the CRD admits any int64 ttl, and a deadline past
        # the year 9999 would overflow datetime and fail every reconcile of the finished job.
        left = ttl - (draft.now - done).total_seconds()
        if left <= 0:
            draft.delete_job = True
        else:
            draft.requeue(left)


def _clean_up_stale(obs: Observed, draft: Draft, settings: PlannerSettings) -> list[PodView]:
    """Delete pods of other attempts; returns those the next attempt must wait for."""
    attempt = obs.job.status.attempt
    current = draft.status.current_attempt
    graceful = current.graceful
    hosts = obs.job.spec.tpu.hosts_per_slice
    blocking = []
    for pod in obs.pods:
        if pod.attempt == attempt:
            continue
        if (
            is_kept(current, pod, obs.job.name, hosts)
            and not pod.terminal
            and pod.deleting_since is None
        ):
            continue  # it rejoins this attempt in place
        node = obs.nodes.get(pod.node) if pod.node else None
        node_gone = pod.node is not None and lost(
            node, now=draft.now, settings=settings.node_health
        )
        if pod.deleting_since is None:
            grace = None if graceful and not pod.terminal else settings.restart_grace_seconds
            draft.delete_pods.append(PodDeletion(pod.name, pod.uid, 0 if pod.terminal else grace))
        elif (draft.now - pod.deleting_since).total_seconds() > (
            settings.force_delete_after_seconds
            if node_gone
            else settings.force_delete_after_seconds
            + obs.job.spec.trainer.termination_grace_period_seconds
        ):
            # Stuck Terminating: its kubelet is gone (or never answers). Free the name and
            # the chips instead of waiting for pod garbage collection.
            draft.delete_pods.append(PodDeletion(pod.name, pod.uid, 0))
            told = f"pod {pod.name} was stuck terminating on {pod.node or 'no node'}"
            # The cache may show the pod again before the force delete lands: say it once.
            if not any(
                e.kind == TimelineKind.FORCE_DELETED and e.message == told
                for e in draft.status.timeline
            ):
                draft.timeline(TimelineKind.FORCE_DELETED, told)
        if not pod.terminal and not node_gone:
            blocking.append(pod)
    return blocking


def attempt_settings(
    obs: Observed,
    current: AttemptStatus,
    pools: dict[int, str],
    planner: PlannerSettings,
    *,
    now: datetime,
) -> manifests.AttemptSettings:
    """How the current attempt's pods are wired, the same at launch and when one is re-created."""
    job = obs.job
    return manifests.AttemptSettings(
        attempt=job.status.attempt,
        pools=pools,
        bad_nodes=avoided_by(
            obs, now=now, return_after=planner.node_health.lost_node_return_seconds
        ),
        collective_timeout_seconds=current.collective_timeout_seconds
        or planner.collective_timeout_seconds,
        rollback_step=current.rollback_step,
        skip_batches=job.status.skip_batches,
        kept={k.slice: k.pods_attempt for k in current.kept_slices},
        slices=current.slices,
        pod_set_updates=queueing.pod_set_updates(obs),
    )


def _launch(obs: Observed, draft: Draft, blocking: list[PodView], planner: PlannerSettings) -> None:
    job, now = obs.job, draft.now
    current = draft.status.current_attempt  # what it keeps may have been given up just now
    if current.not_before is not None and now < current.not_before:
        draft.requeue((current.not_before - now).total_seconds())
        return
    # Kept pods rejoin at once, while the replaced slices' old pods still go: their trainers
    # start again and wait for the new pods at the coordinator.
    rejoin(obs, draft, attempt_settings(obs, current, pools_of(current), planner, now=draft.now))
    if draft.rejoin_pods:
        draft.fence_attempt = job.status.attempt
        draft.create += [
            manifests.headless_service(job),
            manifests.heartbeat_lease(job),
            *manifests.heartbeat_rbac(job),
        ]
    if blocking:
        draft.requeue(1.0)
        return
    avoided = avoided_by(
        obs, now=draft.now, return_after=planner.node_health.lost_node_return_seconds
    )
    found = choose_pools(obs, pools_of(current), avoided, draft=draft, spares=spare_pools(obs))
    pools, current = fit_slices(job, current, found)
    if len(pools) < attempt_slices(job, current) and not say_no_free_pool(obs, draft, pools):
        # Launching part of a gang would hold chips it cannot use; wait for a free pool.
        draft.update(current_attempt=current.model_copy(update={"placement": placement(pools)}))
        draft.requeue(WAIT_FOR_POOL_SECONDS)
        return
    settings = attempt_settings(obs, current, pools, planner, now=draft.now)
    draft.fence_attempt = job.status.attempt
    if not draft.rejoin_pods:
        draft.create += [
            manifests.headless_service(job),
            manifests.heartbeat_lease(job),
            *manifests.heartbeat_rbac(job),
        ]
    draft.create += manifests.attempt_pods(job, settings)
    restored = (
        current.rollback_step if current.rollback_step is not None else job.status.checkpoint_step
    )
    draft.update(
        current_attempt=current.model_copy(
            update={"launched_time": now, "placement": placement(pools), "restored_step": restored}
        )
    )
    where = ", ".join(
        [
            f"slice {s} on {p}" + (" (kept)" if s in settings.kept else "")
            for s, p in sorted(pools.items())
        ]
        + [
            f"slice {s} on a pool to be provisioned"
            for s in unplaced(obs, pools, settings.slice_count(job))
        ]
    )
    draft.timeline(TimelineKind.PODS_CREATED, f"attempt {job.status.attempt}: {where}")
    if current.slices is not None:
        say_degraded(obs, draft, current.slices)
    draft.requeue(1.0)


def _reconcile_attempt(obs: Observed, draft: Draft, settings: PlannerSettings) -> None:
    _run_attempt(obs, draft, settings)
    if draft.status.phase in TERMINAL or queueing.queue_for(obs) is not None:
        # A job queued through Kueue holds what Kueue admitted, no more: spares would be
        # chips outside its quota, so it keeps none (docs/kueue.md).
        release_spares(obs, draft)
    else:
        bad = avoided_by(
            obs, now=draft.now, return_after=settings.node_health.lost_node_return_seconds
        )
        keep_spares(obs, draft, bad)


def _run_attempt(obs: Observed, draft: Draft, settings: PlannerSettings) -> None:
    job, now = obs.job, draft.now
    current = job.status.current_attempt
    if current.launched_time is None:
        abandon_if_broken(obs, draft)
    blocking = _clean_up_stale(obs, draft, settings)
    if current.launched_time is None:
        _launch(obs, draft, blocking, settings)
        return
    _record_progress(obs, draft)
    learn_pools(obs, draft)
    pods = obs.attempt_pods(job.status.attempt)
    tpu = job.spec.tpu
    slices = attempt_slices(job, current)
    expected = slices * tpu.hosts_per_slice
    known = pools_of(draft.status.current_attempt)
    wiring = attempt_settings(obs, current, known, settings, now=draft.now)
    present = {p.name for p in pods} | {
        p.name
        for p in kept_pods(obs, wiring.kept).values()
        if not p.terminal and p.deleting_since is None
    }
    missing = [
        (s, w)
        for s in range(slices)
        for w in range(tpu.hosts_per_slice)
        if manifests.pod_name(job.name, wiring.pods_attempt(s), s, w) not in present
    ]
    if not missing and len(pods) == expected and all(p.phase == "Succeeded" for p in pods):
        draft.update(
            attempt_history=ended_attempt(draft.status, obs.heartbeat, now=now, failed=False)
        )
        _succeeded(draft)
        return
    trouble = find_trouble(
        obs,
        job.status.attempt,
        now=now,
        launched_at=current.launched_time,
        stall_timeout=job.spec.recovery.stall_timeout_seconds,
        startup_timeout=job.spec.recovery.startup_timeout_seconds,
        last_step=own_step(obs),
        health=settings.node_health,
    )
    if trouble is not None:
        handle_failure(obs, draft, trouble, settings)
        return
    refused = draft.status.condition(ConditionType.PODS_REFUSED)
    if not missing and refused is not None and refused.status == ConditionStatus.TRUE:
        draft.condition(
            ConditionType.PODS_REFUSED,
            False,
            ConditionReason.CREATED,
            "every pod of the attempt exists",
        )
    # A kept pod belongs to the attempt once told to rejoin it; one an operator restarted
    # in between did not tell yet is told here, after the fence, as at launch.
    rejoin(obs, draft, wiring)
    if missing or draft.rejoin_pods:  # missing: the launch did not finish, or someone removed it
        draft.fence_attempt = job.status.attempt
        draft.create += [
            manifests.headless_service(job),
            manifests.heartbeat_lease(job),
            *manifests.heartbeat_rbac(job),
            *(manifests.trainer_pod(job, wiring, s, w) for s, w in missing),
        ]
    _watch_health(
        obs, draft, pods, expected_count=expected, provisioning=bool(unplaced(obs, known, slices))
    )
    if not missing and not draft.rejoin_pods:
        grow_back(obs, draft, settings)


def own_step(obs: Observed) -> int | None:
    """The last step the current attempt itself reported, None before its first heartbeat.

    `status.progress` may still hold the previous attempt's step; a failure stamped with it
    would look like "the same failure at the same step" to the repeat guard, and a transient
    fault during a restore would end the job as deterministic.
    """
    beat = obs.heartbeat
    if beat is None or beat.attempt != obs.job.status.attempt:
        return None
    return beat.step


def _record_progress(obs: Observed, draft: Draft) -> None:
    beat, job = obs.heartbeat, obs.job
    if beat is None or beat.step is None:
        return
    total = beat.total_steps or job.spec.trainer.total_steps
    draft.update(
        progress=Progress(
            step=beat.step,
            total_steps=total,
            steps_per_second=beat.steps_per_second,
            loss=round(beat.loss, 6) if beat.loss is not None else None,
        )
    )
    if beat.checkpoint_step is not None:
        draft.update(checkpoint_step=beat.checkpoint_step)


def _watch_health(
    obs: Observed,
    draft: Draft,
    pods: tuple[PodView, ...],
    expected_count: int,
    provisioning: bool = False,
) -> None:
    job, now = obs.job, draft.now
    current = draft.status.current_attempt
    beat = obs.heartbeat
    resumed = beat is not None and beat.attempt == job.status.attempt and beat.step is not None
    if resumed and current.resumed_step is None and beat is not None:
        draft.update(
            current_attempt=current.model_copy(
                update={
                    "resumed_step": beat.step,
                    "recovering_since": None,
                    "first_heartbeat_time": now,
                }
            )
        )
        if current.recovering_since is not None:
            seconds = (now - current.recovering_since).total_seconds()
            draft.recovery_seconds = seconds
            draft.timeline(
                TimelineKind.RESUMED,
                f"attempt {job.status.attempt} trains from step "
                f"{beat.step} ({seconds:.1f}s after the failure)",
            )
            draft.event(
                EventType.NORMAL,
                EventReason.RESUMED,
                f"training resumed at step {beat.step} after {seconds:.1f}s",
            )
    all_running = len(pods) == expected_count and all(p.running for p in pods)
    if all_running and draft.status.phase is not Phase.RUNNING:
        draft.update(phase=Phase.RUNNING)
        on = attempt_slices(job, current)
        draft.condition(
            ConditionType.RUNNING,
            True,
            ConditionReason.ALL_WORKERS_RUNNING,
            f"{expected_count} workers running"
            + (f" on {on} of {job.spec.tpu.slices} slices" if on < job.spec.tpu.slices else ""),
        )
        draft.condition(ConditionType.RECOVERING, False, ConditionReason.RUNNING)
    watch_training_health(obs, draft, pods)
    watch_heartbeat(obs, draft, pods)
    if not provisioning:  # pods waiting for a pool the autoscaler provides are not stuck
        say_pods_not_starting(draft, pods)


def _succeeded(draft: Draft) -> None:
    draft.update(phase=Phase.SUCCEEDED, completion_time=draft.now)
    draft.condition(
        ConditionType.SUCCEEDED, True, ConditionReason.ALL_WORKERS_SUCCEEDED, "training finished"
    )
    draft.condition(ConditionType.RUNNING, False, ConditionReason.FINISHED)
    draft.condition(ConditionType.RECOVERING, False, ConditionReason.FINISHED)
    draft.timeline(TimelineKind.SUCCEEDED, "every worker exited 0")
    draft.event(EventType.NORMAL, EventReason.SUCCEEDED, "training finished")
