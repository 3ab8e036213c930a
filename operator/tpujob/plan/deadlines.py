"""When a starting or running job must be looked at again though no event woke it.

Pure; part of planning. A job whose pods all run, on nodes with nothing wrong, changes only
by events, each of which wakes it (`tpujob.controller.wakeups`): a pod's or a node's update,
a supervisor's report, its heartbeat (at least every few seconds while it trains, at most once
per progress interval). What no event tells is time passing: a trainer that stops renewing its
heartbeat, or one that never starts to. Such a job is looked at again at its next deadline,
under a long net (`PlannerSettings.steady_poll_seconds`), instead of every few seconds: at
250 running jobs a 5-second poll was 50 reconciles a second that found nothing to do.

A starting job's pods that wait (for the scheduler, or on their node for their container to
start) change by events too; the graces after which the Running condition names one are asked
for as deadlines (`tpujob.plan.starting`). At 250 jobs starting at once the short poll was
two reconciles in five of the burst.

Anything in motion keeps the operator's short poll, since its timers are not all deadlines
here: a pod being deleted or reported ended (force-delete and lost-peer graces), a container
refused a start (judged a failure after its grace), a node whose trouble is still within its
grace, or effects this reconcile sends (pods made for a spare pool among them; once made, they
too wait for the scheduler's binding, an event).
"""

from __future__ import annotations

from tpujob.observed.nodes import NodeTrouble, judge
from tpujob.observed.trouble import FAILED_START_REASONS, stall_clock
from tpujob.observed.views import Observed
from tpujob.plan.heartbeat_condition import seconds_to_announce
from tpujob.plan.result import Draft, PlannerSettings

# A deadline is looked at just after it passes: the stall judgement is "older than", not "as old
# as", the limit.
PAST_DEADLINE_SECONDS = 0.5


def in_motion(obs: Observed, draft: Draft, settings: PlannerSettings) -> bool:
    """Whether something about the job changes with time, not only with events."""
    if draft.create or draft.delete_pods or draft.rejoin_pods or draft.mark_nodes:
        return True
    for pod in (*obs.pods, *obs.spares):
        if pod.terminal:
            continue
        if pod.deleting_since is not None or pod.reported is not None:
            return True
        if not pod.running:
            if pod.waiting_reason in FAILED_START_REASONS:
                return True
            if not pod.node:
                continue  # waits for the scheduler, which wakes the job when it binds the pod
        verdict = judge(
            obs.nodes.get(pod.node) if pod.node else None,
            now=draft.now,
            settings=settings.node_health,
            tpu_short_since=obs.tpu_short_since,
            name=pod.node or "",
        )
        if verdict.trouble is not NodeTrouble.NONE:
            return True
    return False


def pace(obs: Observed, draft: Draft, settings: PlannerSettings) -> None:
    """Set when a starting or running job is looked at again: at its heartbeat's deadlines in
    any case, and only then (or at the steady poll) when nothing about it is in motion."""
    job, now = obs.job, draft.now
    pods = obs.attempt_pods(job.status.attempt)
    clock = stall_clock(
        obs,
        pods,
        now=now,
        launched_at=draft.status.current_attempt.launched_time,
        timeout=job.spec.recovery.stall_timeout_seconds,
        startup_timeout=job.spec.recovery.startup_timeout_seconds,
    )
    stall = None if clock is None else clock[1] - (now - clock[0]).total_seconds()
    for left in (stall, seconds_to_announce(obs, pods, now=now)):
        if left is not None:
            draft.requeue(left + PAST_DEADLINE_SECONDS)
    if not in_motion(obs, draft, settings):
        draft.requeue_after = max(draft.requeue_after, settings.steady_poll_seconds)
