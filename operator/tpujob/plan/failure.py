"""Planning after a failure: diagnose it, decide, and plan the next attempt or the end.

Pure; called by `tpujob.plan.planner` when the current attempt is in trouble.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from tpujob import diagnosis as dx
from tpujob.api import ConditionType, LastFailure, Phase, TPUTrainingJobStatus, contract, labels
from tpujob.api import constants as c
from tpujob.api.attempt import FAILURE_HISTORY_LIMIT, AttemptStatus
from tpujob.api.reasons import ConditionReason, EventReason, EventType, TimelineKind
from tpujob.gcp.catalogue import pool_advice
from tpujob.observed.nodes import NodeHealthSettings, judge
from tpujob.observed.trouble import Trouble, user_rules
from tpujob.observed.views import Observed
from tpujob.plan.elastic import elastic
from tpujob.plan.failed_nodes import avoided_by, avoided_nodes, mark_reason, record_blames
from tpujob.plan.goodput import ended_attempt
from tpujob.plan.job_memory import past_failure
from tpujob.plan.placement import placement
from tpujob.plan.pools import choose_pools
from tpujob.plan.recovery import Broken, FailJob, Restart, decide
from tpujob.plan.regrading import Around, regrade
from tpujob.plan.result import Draft, NodeMark, PlannerSettings, PodDeletion
from tpujob.plan.rollback import Rollback, plan_rollback
from tpujob.plan.slices import kept_slices, slices_to_keep
from tpujob.plan.spares import spare_pools


def broken_by(
    obs: Observed, trouble: Trouble, d: dx.Diagnosis, *, now: datetime, health: NodeHealthSettings
) -> Broken:
    """Nodes the failure broke, judged with the same debounce as the failure itself: a node
    NotReady for a moment while its worker failed for another reason is not blamed."""
    pods = {p.name: p for p in obs.attempt_pods(obs.job.status.attempt)}
    lost: list[str] = []
    moving: list[str] = []
    slices: set[int] = set()
    for pod in pods.values():
        if pod.node is None:
            continue
        if pod.unhealthy_devices:
            # The kubelet says this worker's own chips are unhealthy: node evidence.
            slices.add(pod.slice)
            lost.append(pod.node)
            continue
        verdict = judge(
            obs.nodes.get(pod.node),
            now=now,
            settings=health,
            tpu_short_since=obs.tpu_short_since,
            name=pod.node,
        )
        if not verdict.trouble.failure:
            continue
        slices.add(pod.slice)
        (lost if verdict.trouble.broken else moving).append(pod.node)
    root = next(
        (
            w
            for w in trouble.facts.workers
            if d.root_worker is not None and w.worker_index == d.root_worker
        ),
        None,
    )
    return Broken(
        lost_nodes=tuple(sorted(set(lost))),
        moving_nodes=tuple(sorted(set(moving))),
        slices=frozenset(slices),
        root_node=root.node_name if root else None,
        root_slice=root.slice_index if root else None,
    )


def _last_failure(d: dx.Diagnosis, trouble: Trouble, action: str) -> LastFailure:
    root = next((w for w in trouble.facts.workers if w.worker_index == d.root_worker), None)
    if root is None and trouble.facts.workers:
        root = trouble.facts.workers[0]
    return LastFailure.model_validate(
        {
            "class": str(d.failure_class),
            "code": str(d.code),
            "summary": d.summary[:4000],
            "chain": [str(link)[:1000] for link in d.chain][: c.MAX_CHAIN],
            "evidence": [str(e)[:1000] for e in d.evidence][: c.MAX_EVIDENCE],
            "advice": d.advice or None,
            "pod": root.pod_name if root else None,
            "node": (root.node_name or None) if root else None,
            "time": trouble.seen_at,
            "action": action[:256],
        }
    )


def handle_failure(
    obs: Observed, draft: Draft, trouble: Trouble, settings: PlannerSettings
) -> None:
    job = obs.job
    status = job.status
    history = [past_failure(r) for r in status.failure_history]
    d = dx.diagnose_job(
        trouble.facts,
        user_rules=user_rules(job.spec.recovery.rules),
        site_rules=obs.site_rules,
        history=history,
        unknown_retry_limit=settings.unknown_retry_limit,
    )
    if _root_may_still_come(obs, trouble, d, draft, settings):
        return
    broken = broken_by(obs, trouble, d, now=draft.now, health=settings.node_health)
    around = Around(
        obs=obs,
        history=history,
        diagnosed_class=d.failure_class,
        root_node=broken.root_node,
        root_slice=broken.root_slice,
        progressed=progressed(obs),
        unknown_retry_limit=settings.unknown_retry_limit,
        now=draft.now,
    )
    regraded = regrade(d, around)
    d, draft.ledger_blame = regraded.diagnosis, regraded.ledger_blame
    assert regraded.record is not None  # the history row always makes it
    own_blame = regraded.memory_blame or _busy_device_node(d, broken)
    marked = regraded.ledger_node
    if marked is None and regraded.memory_blame and settings.trusts_history_of(job.namespace):
        marked, own_blame = regraded.memory_blame, None
    if own_blame or marked:
        slices = broken.slices | ({broken.root_slice} if broken.root_slice is not None else set())
        broken = replace(
            broken,
            slices=frozenset(slices),
            history_nodes=(marked,) if marked else (),
            job_nodes=(own_blame,) if own_blame else (),
        )
    decision = decide(d, job, broken, base_collective_timeout=settings.collective_timeout_seconds)
    draft.diagnosis = d
    draft.update(
        failure_history=(*status.failure_history, regraded.record)[-FAILURE_HISTORY_LIMIT:],
        attempt_history=ended_attempt(
            draft.status, obs.heartbeat, now=trouble.seen_at, failed=True
        ),
    )
    draft.timeline(
        TimelineKind.FAILURE_SEEN,
        f"attempt {status.attempt}: pods {', '.join(trouble.pods)}",
        at=trouble.seen_at,
    )
    draft.timeline(TimelineKind.DIAGNOSED, d.headline)
    draft.event(
        EventType.WARNING,
        EventReason.FAILURE_DIAGNOSED,
        d.headline + (f" Advice: {d.advice}" if d.advice else ""),
    )
    keep: frozenset[int] = frozenset()
    if isinstance(decision, Restart):
        after = settings.node_health.lost_node_return_seconds
        blamed = avoided_by(obs, now=draft.now, return_after=after) | set(decision.blame_nodes)
        keep = slices_to_keep(obs, trouble, broken, decision, settings=settings, bad_nodes=blamed)
    for pod in obs.attempt_pods(status.attempt):
        if not pod.terminal and pod.deleting_since is None and pod.slice not in keep:
            grace = (
                None
                if isinstance(decision, Restart) and decision.graceful
                else settings.restart_grace_seconds
            )
            draft.delete_pods.append(PodDeletion(pod.name, pod.uid, grace))
    if isinstance(decision, FailJob):
        _fail(draft, d, trouble, decision)
    else:
        _restart(obs, draft, d, trouble, decision, kept=keep, settings=settings)


def progressed(obs: Observed) -> bool:
    """Whether the current attempt trained: its own heartbeat moved past its first step and
    past the step where the previous failure struck (re-doing the same steps and failing
    again at that point is not progress)."""
    beat, job = obs.heartbeat, obs.job
    first = job.status.current_attempt.resumed_step
    if beat is None or beat.attempt != job.status.attempt or beat.step is None or first is None:
        return False
    history = job.status.failure_history
    before = history[-1].step if history and history[-1].step is not None else first
    return beat.step > max(first, before)


def _busy_device_node(d: dx.Diagnosis, broken: Broken) -> str | None:
    """The cascade grades a device held busy twice on one node hard: history, node evidence."""
    if d.code is dx.FailureCode.DEVICE_BUSY and d.failure_class is dx.FailureClass.HARD:
        return broken.root_node
    return None


# Codes that, alone, say that some other worker went away (the trainer reports them as its own).
PEER_LOST_CODES = frozenset({dx.FailureCode.COLLECTIVE_FAILURE, dx.FailureCode.COLLECTIVE_TIMEOUT})


def _root_may_still_come(
    obs: Observed, trouble: Trouble, d: dx.Diagnosis, draft: Draft, settings: PlannerSettings
) -> bool:
    """A consequence ("connection closed by peer") while other workers still run: the dead
    peer's status is usually a moment behind; wait for it briefly instead of blaming the echo."""
    waited = (draft.now - trouble.seen_at).total_seconds()
    echo = d.consequence or d.code in PEER_LOST_CODES
    if not echo or waited >= settings.cascade_settle_seconds:
        return False
    others = [
        p
        for p in obs.attempt_pods(obs.job.status.attempt)
        if p.name not in trouble.pods and not p.terminal
    ]
    if not others:
        return False
    draft.requeue(settings.cascade_settle_seconds - waited)
    return True


def _fail(draft: Draft, d: dx.Diagnosis, trouble: Trouble, decision: FailJob) -> None:
    draft.update(
        phase=Phase.FAILED,
        completion_time=draft.now,
        last_failure=_last_failure(d, trouble, "failed the job"),
    )
    draft.condition(ConditionType.FAILED, True, decision.reason, decision.message)
    draft.condition(ConditionType.RUNNING, False, decision.reason)
    draft.condition(ConditionType.RECOVERING, False, decision.reason)
    draft.timeline(TimelineKind.FAILED, decision.message)
    draft.event(EventType.WARNING, decision.reason, decision.message)


def _restart(
    obs: Observed,
    draft: Draft,
    d: dx.Diagnosis,
    trouble: Trouble,
    decision: Restart,
    *,
    kept: frozenset[int],
    settings: PlannerSettings,
) -> None:
    job, now = obs.job, draft.now
    after = settings.node_health.lost_node_return_seconds
    status = job.status
    node_action = job.spec.recovery.bad_node_action
    failed = record_blames(
        status.failed_nodes,
        blame=decision.blame_nodes,
        mark=decision.mark_nodes,
        nodes=obs.nodes,
        action=node_action,
        code=str(d.code),
        now=now,
        return_after=after,
    )
    bad = avoided_nodes(failed, obs.nodes, node_action, now=now, return_after=after)
    taken = held_unseen(obs)
    keep = {
        p.slice: p.node_pool
        for p in status.current_attempt.placement
        if p.slice not in decision.move_slices and p.node_pool not in taken
    }
    # A moved slice leaves its pool even when no node there is blamed (a trainer's own hard
    # grade): the pool it left ranks with the busy ones, taken again only if nothing else is.
    # So does a pool whose chips something this operator does not watch holds.
    left = taken | frozenset(
        p.node_pool for p in status.current_attempt.placement if p.slice in decision.move_slices
    )
    pools = choose_pools(obs, keep, bad, draft=draft, avoid=left, spares=spare_pools(obs))
    tpu = job.spec.tpu
    attempt = status.attempt + 1
    not_before = now + timedelta(seconds=decision.delay_seconds) if decision.delay_seconds else None
    slices = status.current_attempt.slice_count(tpu.slices)
    unplaced = set(range(tpu.slices)) - set(pools)
    if elastic(job) and set(range(slices)) - set(pools):
        # A slice of this attempt has no pool: the next may launch on fewer slices
        # (`tpujob.plan.elastic`), and no pod may keep the count it was made with.
        kept = frozenset()
    if kept:
        # Pods kept in place run with the attempt's slice count, so the next attempt keeps it.
        pools = {s: p for s, p in pools.items() if s < slices}
    advice = pool_advice(obs.catalogue, tpu.accelerator, tpu.topology) if unplaced else None
    if advice:
        d = replace(d, advice=f"{d.advice} {advice}".strip())
    action = _describe(decision, pools, attempt, kept, slices)
    rollback = _rollback(d, trouble, status)
    if rollback is not None:
        action += "; " + rollback.describe(job.spec.recovery.max_nan_rollbacks)
    budget = job.spec.max_failed_nodes_count()
    draft.update(
        attempt=attempt,
        phase=Phase.RECOVERING,
        restarts=status.restarts.incremented(decision.failure_class),
        failed_nodes=tuple(failed)[-c.MAX_FAILED_NODES_RECORDED :],
        failed_node_budget=budget,
        failed_node_budget_left=max(0, budget - len(failed)),
        last_failure=_last_failure(d, trouble, action),
        nan_rollbacks=rollback.count if rollback else status.nan_rollbacks,
        skip_batches=rollback.windows if rollback else status.skip_batches,
        current_attempt=AttemptStatus(
            placement=placement(pools),
            not_before=not_before,
            collective_timeout_seconds=decision.collective_timeout_seconds,
            graceful=decision.graceful,
            recovering_since=trouble.seen_at,
            rollback_step=rollback.resume_step if rollback else None,
            kept_slices=kept_slices(job, kept),
            slices=status.current_attempt.slices if kept else None,
            resizable=elastic(job) and not kept,
        ),
    )
    for node in decision.mark_nodes:
        draft.mark_nodes.append(
            NodeMark(
                node,
                job.spec.recovery.bad_node_action,
                mark_reason(job.namespace, job.name, str(d.code)),
            )
        )
    draft.condition(ConditionType.RECOVERING, True, d.code, action)
    draft.condition(ConditionType.RUNNING, False, ConditionReason.RECOVERING, d.headline)
    draft.timeline(TimelineKind.RESTARTING, f"{d.tag} {action}")
    draft.event(EventType.NORMAL, EventReason.RESTARTING, f"{d.tag} {action}")
    draft.requeue(decision.delay_seconds or 0.5)


def held_unseen(obs: Observed) -> frozenset[str]:
    """Pools where the scheduler refused the attempt's pods for want of TPU chips: something
    the operator does not watch (not a tpujob job: a JobSet, a plain pod) holds them, though
    no job's claim or pod says so."""
    return frozenset(
        p.node_pool
        for p in obs.attempt_pods(obs.job.status.attempt)
        if p.node_pool and labels.TPU_RESOURCE in (p.unschedulable_message or "")
    )


def _rollback(d: dx.Diagnosis, trouble: Trouble, status: TPUTrainingJobStatus) -> Rollback | None:
    """The rollback a non-finite loss calls for: from the trainer's own report of the step
    and of its last committed checkpoint, else the heartbeat's."""
    if d.code is not dx.FailureCode.NAN_LOSS:
        return None
    root = next((w for w in trouble.facts.workers if w.worker_index == d.root_worker), None)
    message = contract.parse_termination_message(root.message) if root else None
    checkpoint = (
        message.checkpoint_step
        if message and message.checkpoint_step is not None
        else status.checkpoint_step
    )
    return plan_rollback(
        nan_step=d.step,
        checkpoint_step=checkpoint,
        windows=status.skip_batches,
        done=status.nan_rollbacks or 0,
    )


def _describe(
    decision: Restart, pools: dict[int, str], attempt: int, kept: frozenset[int], slices: int
) -> str:
    parts = [f"attempt {attempt}"]
    if len(kept) == slices:
        return f"attempt {attempt}; every trainer restarted in its pod, no pod replaced"
    if kept:
        parts.append(f"slice {', '.join(str(s) for s in sorted(kept))} kept in place")
    if decision.delay_seconds:
        parts.append(f"after {decision.delay_seconds}s backoff")
    if decision.failure_class.value == "medium":
        parts.append(f"collective timeout {decision.collective_timeout_seconds}s")
    if decision.mark_nodes:
        parts.append(f"node {', '.join(decision.mark_nodes)} marked bad")
    avoided = [n for n in decision.blame_nodes if n not in decision.mark_nodes]
    if avoided:
        parts.append(f"node {', '.join(avoided)} avoided by this job")
    if decision.move_slices:
        moved = ", ".join(
            f"slice {s} -> {pools.get(s, 'no healthy pool yet')}"
            for s in sorted(decision.move_slices)
        )
        parts.append(moved)
    if decision.graceful:
        parts.append("old pods given their grace period to save")
    return "; ".join(parts)
