"""From what the operator observed to the facts the diagnosis reads.

Pure. The current attempt's troubled workers become `WorkerFacts`: failed pods with their exit
status, termination message and log tail; pods being deleted by someone else (eviction,
preemption); pods whose own TPU devices the kubelet reports Unhealthy; pods whose node has
been lost, short of TPUs or going into maintenance for longer than `tpujob.observed.nodes`'s grace;
and running pods whose training process ended, as their supervisor reported it (the pod is
held for the operator's word, so the process may restart in it). A reported process that only
lost a peer is an echo of another's failure: it counts only when nothing else does, and only
once the supervisor of old would have ended its pod (`PEER_LOST_GRACE_SECONDS`), so the root
failure has the time to show. A node's passing trouble (a kubelet or device-plugin restart) is
no failure. The job's heartbeat becomes `HeartbeatFacts` when it has stalled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from tpujob import diagnosis as dx
from tpujob.api import UserRule as ApiUserRule
from tpujob.api import contract, labels
from tpujob.observed.nodes import (
    DEFAULT_HEALTH,
    NodeHealthSettings,
    NodeTrouble,
    Verdict,
    judge,
    tpu_short,
)
from tpujob.observed.views import NodeView, Observed, PodView, parse_time

# How long a reported lost peer waits for the root failure to show: a multislice job's other
# slice may take a lost node's grace to be judged; in a job of one slice the root's own report
# or end follows within seconds.
PEER_LOST_GRACE_SECONDS = 30.0
ONE_SLICE_PEER_LOST_GRACE_SECONDS = 10.0
# Waiting states in which the kubelet already failed to start the container, and says why in
# the message: an image it could not pull or whose name is invalid, a Secret or ConfigMap the
# container needs that is missing. The kubelet retries them with a back-off, so a pod in one
# never fails by itself; this long after the pod reached its node it is the attempt's failure,
# diagnosed from the reason and message. `ImagePullBackOff` is not among them: its message only
# says it waits (the next try shows `ErrImagePull` with the cause again), and
# `ContainerCreating` says nothing (a volume that cannot mount shows only in Events): the
# planner names such a pod in the status (`tpujob.plan.starting`).
FAILED_START_REASONS = frozenset(
    {
        "ErrImagePull",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)
FAILED_START_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class Trouble:
    """The attempt's failure as seen: the facts and when it was first visible."""

    facts: dx.JobFacts
    seen_at: datetime
    pods: tuple[str, ...]
    nodes: tuple[str, ...]
    # Every troubled pod still runs and only its process ended, as reported: the failure may
    # be restarted in the pods it happened in.
    reported_only: bool = False


def failed_to_start(pod: PodView, now: datetime) -> bool:
    """The pod's container was refused a start for long enough (`FAILED_START_REASONS`)."""
    if pod.running or pod.terminal or pod.waiting_reason not in FAILED_START_REASONS:
        return False
    since = pod.scheduled_since or pod.created
    return since is None or (now - since).total_seconds() >= FAILED_START_GRACE_SECONDS


def node_facts(
    node: NodeView | None,
    name: str,
    tpu_requested: int,
    *,
    verdict: Verdict | None = None,
    pod: PodView | None = None,
) -> dx.NodeFacts:
    """The node as the diagnosis should judge it.

    With a `verdict`, trouble still within its grace is not shown: a Ready=False of two
    seconds, or a shortfall of TPUs while the device plugin restarts, is not the cause of a
    worker's failure.
    """
    if node is None:
        return dx.NodeFacts(name=name, exists=False, ready="Unknown")
    settled = verdict is None or verdict.trouble is not NodeTrouble.SUSPECT
    shows_ready = node.ready if settled or node.ready == "True" else "True"
    short = tpu_short(node) and settled
    return dx.NodeFacts(
        name=node.name,
        ready=shows_ready,
        taints=tuple(k for k, _ in node.taints),
        labels=dict(node.labels),
        accelerator_unhealthy=bool(pod is not None and pod.unhealthy_devices),
        tpu_allocatable=(node.tpu_allocatable if short else node.tpu_capacity)
        if node.tpu_capacity
        else None,
        tpu_requested=tpu_requested or None,
    )


def worker_facts(
    obs: Observed,
    pod: PodView,
    *,
    step: int | None,
    verdict: Verdict | None = None,
    now: datetime | None = None,
) -> dx.WorkerFacts:
    chips = obs.job.spec.tpu.chips_per_host
    node = obs.nodes.get(pod.node) if pod.node else None
    context = []
    if pod.deleting_since is not None and not pod.terminal:
        context.append(
            "the pod is being deleted"
            + (f" ({pod.disruption_reason})" if pod.disruption_reason else "")
        )
    if pod.unhealthy_devices:
        context.append(
            f"the kubelet reports {labels.TPU_RESOURCE} device(s) "
            f"{', '.join(pod.unhealthy_devices)} of this pod Unhealthy"
        )
    if verdict is not None and verdict.trouble is not NodeTrouble.NONE and verdict.reason:
        context.append(verdict.reason)
    if pod.exit_code is None and pod.waiting_reason in FAILED_START_REASONS:
        # Read as the kubelet's Events say it: the reason, then why.
        said = f"{pod.waiting_reason}: {pod.waiting_message}".rstrip(": ")
        pod = replace(pod, reason=pod.waiting_reason, message=said)
        context.append("the container never started: the kubelet keeps retrying")
    report = pod.reported
    if report is not None and pod.exit_code is None:
        reason, message = report.reason, report.message
        if reason == contract.CONTAINER_KILLED_REASON:
            # The container was killed whole and restarted in its pod: the kubelet's record
            # of that end alone says whether it was the OOM killer.
            reason, message = pod.last_reason or "Error", pod.last_message or message
        pod = replace(
            pod,
            exit_code=report.exit_code,
            signal=report.signal,
            reason=reason,
            message=message,
            finished_at=report_time(report, now),
        )
        context.append("the pod runs on; its training process ended (reported by its supervisor)")
    return dx.WorkerFacts(
        worker_index=pod.slice * obs.job.spec.tpu.hosts_per_slice + pod.worker,
        slice_index=pod.slice,
        pod_name=pod.name,
        node_name=pod.node or "",
        exit_code=pod.exit_code,
        signal=pod.signal,
        reason=pod.reason,
        message=pod.message,
        log_tail=obs.log_tails.get(pod.name, ""),
        context="; ".join(context),
        disruption=pod.disruption_reason,
        node=node_facts(node, pod.node, chips, verdict=verdict, pod=pod) if pod.node else None,
        step=_reported_step(pod) if _reported_step(pod) is not None else step,
        finished_at=pod.finished_at or pod.deleting_since,
    )


def report_time(report: contract.FailureReport, now: datetime | None) -> datetime | None:
    """When the reported process ended, by its node's clock: never later than `now` (a clock
    ahead must not date a failure in the future)."""
    at = parse_time(report.at)
    return min(at, now) if at is not None and now is not None else at


def _reported_step(pod: PodView) -> int | None:
    """The step in the trainer's own termination message: exact, where the heartbeat lags."""
    message = contract.parse_termination_message(pod.message)
    return message.step if message is not None else None


def find_trouble(
    obs: Observed,
    attempt: int,
    *,
    now: datetime,
    launched_at: datetime | None,
    stall_timeout: float,
    startup_timeout: float,
    last_step: int | None,
    health: NodeHealthSettings = DEFAULT_HEALTH,
) -> Trouble | None:
    """The failure of `attempt`, or None while it is healthy (or still starting)."""
    pods = obs.attempt_pods(attempt)
    troubled: list[tuple[PodView, Verdict | None]] = []
    reported: list[tuple[PodView, Verdict | None]] = []  # root failures the supervisor held
    echoes: list[tuple[PodView, Verdict | None]] = []  # reported lost peers
    for pod in pods:
        verdict = (
            judge(
                obs.nodes.get(pod.node),
                now=now,
                settings=health,
                tpu_short_since=obs.tpu_short_since,
                name=pod.node,
            )
            if pod.node
            else None
        )
        deleted = pod.deleting_since is not None and not pod.terminal
        live = bool(pod.node) and not pod.terminal
        lost = live and verdict is not None and verdict.trouble.failure
        chips_failed = live and bool(pod.unhealthy_devices)
        if pod.failed or deleted or lost or chips_failed or failed_to_start(pod, now):
            troubled.append((pod, verdict))
        elif live and pod.reported is not None:
            report = pod.reported
            (echoes if contract.lost_a_peer(report.exit_code, report.signal) else reported).append(
                (pod, verdict)
            )
    reported_only = not troubled and bool(reported or echoes)
    troubled += reported or ([] if troubled else _settled_echoes(obs, echoes, now))
    if troubled:
        workers = tuple(
            worker_facts(obs, p, step=last_step, verdict=v, now=now) for p, v in troubled
        )
        times = [w.finished_at for w in workers if w.finished_at is not None]
        return Trouble(
            dx.JobFacts(workers=workers),
            min(times, default=now),
            tuple(p.name for p, _ in troubled),
            tuple(sorted({p.node for p, _ in troubled if p.node})),
            reported_only=reported_only,
        )
    clock = stall_clock(
        obs,
        pods,
        now=now,
        launched_at=launched_at,
        timeout=stall_timeout,
        startup_timeout=startup_timeout,
    )
    heartbeat = _stalled(obs, clock, now)
    if heartbeat is not None:
        return Trouble(dx.JobFacts(heartbeat=heartbeat), now, tuple(p.name for p in pods), ())
    return None


def _settled_echoes(
    obs: Observed, echoes: list[tuple[PodView, Verdict | None]], now: datetime
) -> list[tuple[PodView, Verdict | None]]:
    """Reported lost peers, once the earliest is older than the grace for the root to show."""
    multislice = obs.job.spec.tpu.slices > 1
    grace = PEER_LOST_GRACE_SECONDS if multislice else ONE_SLICE_PEER_LOST_GRACE_SECONDS
    times = [t for p, _ in echoes if p.reported and (t := report_time(p.reported, now))]
    if not times or (now - min(times)).total_seconds() < grace:
        return []
    return echoes


def stall_clock(
    obs: Observed,
    pods: Sequence[PodView],
    *,
    now: datetime,
    launched_at: datetime | None,
    timeout: float,
    startup_timeout: float,
) -> tuple[datetime, float] | None:
    """Since when the heartbeat's clock runs and its limit in seconds, or None when the job is
    not judged by its heartbeat now. The attempt is found hung once `since` is older than the
    limit; a renewal moves `since`, and wakes the job.

    Only a trainer that announced the heartbeat contract for this attempt is judged by it: one
    that never writes the Lease (the user's own, without the SDK) is not hung for being silent.
    Between the announcement and the first step the clock starts when the last worker started
    running and the limit is the start-up timeout. A timeout of 0 is off. Time the API server
    was unreachable, or the heartbeat watch broken, does not count
    (`Observed.heartbeats_seen_since`).
    """
    if timeout <= 0 or not pods or launched_at is None or not all(p.running for p in pods):
        return None
    beat = obs.heartbeat
    if beat is None or beat.attempt != obs.job.status.attempt or beat.renewed is None:
        return None
    if beat.step is not None:
        # Witnessed by the operator's clock when it can be: the trainer's may be off.
        since, limit = beat.seen or beat.renewed, timeout
    else:
        # Start times are the kubelet's clock: one ahead must not hold the clock back.
        started = [min(p.running_since, now) for p in pods if p.running_since is not None]
        since, limit = max([launched_at, *started]), startup_timeout
    seen_since = obs.heartbeats_seen_since
    if seen_since is not None and seen_since > since:
        # An apiserver outage is no hang: the trainers could not renew, nor could the operator
        # see them renew; they get a whole stall timeout from the API's and the watch's return.
        since = seen_since
    return since, limit


def _stalled(
    obs: Observed, clock: tuple[datetime, float] | None, now: datetime
) -> dx.HeartbeatFacts | None:
    """A heartbeat older than its limit (`stall_clock`) while every worker runs is a hang."""
    if clock is None or obs.heartbeat is None:
        return None
    since, limit = clock
    seconds = (now - since).total_seconds()
    if seconds <= limit:
        return None
    return dx.HeartbeatFacts(seconds_since=seconds, stall_timeout=limit, step=obs.heartbeat.step)


def user_rules(rules: Sequence[ApiUserRule]) -> tuple[dx.UserRule, ...]:
    """The job's spec.recovery.rules in the diagnosis engine's terms."""
    converted = []
    for index, rule in enumerate(rules):
        try:
            code = dx.FailureCode(rule.code) if rule.code else None
        except ValueError:
            code = None
        converted.append(
            dx.UserRule(
                failure_class=dx.FailureClass(str(rule.failure_class)),
                code=code,
                exit_codes=tuple(rule.exit_codes or ()),
                reasons=tuple(rule.reasons or ()),
                message_regex=rule.message_pattern,
                name=f"spec.recovery.rules[{index}]",
            )
        )
    return tuple(converted)
