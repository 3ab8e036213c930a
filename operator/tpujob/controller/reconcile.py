"""One reconcile of one job: observe -> plan -> write status once -> act -> tell.

The async shell around the pure planner. Reads come from the watch-fed cache (`Deps.view`)
in the event loop; client calls are blocking, so they and the planning run in worker threads;
the status is written before any effect, and Events and metrics only after the status write
succeeded (a failed write leaves nothing half-told). A status that differs only in progress
numbers is written at most once per `progress_interval_seconds`, and one that differs only in
what the clock moves (the goodput breakdown) is not written on its own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import replace
from functools import partial
from typing import Any

from tpujob.api import (
    InvalidJobError,
    Phase,
    TPUTrainingJobStatus,
    labels,
    parse_status,
    status_patch,
)
from tpujob.controller.deps import Deps
from tpujob.controller.ledger_store import ledger_rows, remember_blame
from tpujob.controller.wakeups import JobKey, Shape
from tpujob.kube.cache import newer
from tpujob.kube.errors import ForbiddenError, InvalidError, KubeError, UnavailableError
from tpujob.kube.observe import observe, tails_to_read, with_tails
from tpujob.observed.views import Observed
from tpujob.plan import reports
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan

__all__ = ["Deps", "reconcile", "release_pools"]

log = logging.getLogger("tpujob.controller.reconcile")
INVALID_SPEC_RETRY_SECONDS = 300.0
# A reconcile that finds no cache attached yet is tried again this soon (see `_reconcile`).
CACHE_WAIT_SECONDS = 1.0
# A refused pod is retried this often: a raised quota or a fixed policy takes effect soon,
# and each retry is one create call.
REFUSED_RETRY_SECONDS = 10.0
SLOW_PLAN_RETRY_SECONDS = 60.0
# A new job waits this long at most for kopf's finalizer before its first reconcile (it is
# woken as soon as the finalizer shows); past it, or for an older job, it goes on without.
FINALIZER_WAIT_SECONDS = 10.0
FINALIZER_POLL_SECONDS = 2.0
# A failed container's log does not change: its tail is read once and kept (by pod uid).
TAIL_CACHE_SIZE = 2048
# Status fields that change with the clock alone (the goodput breakdown of a job grows with
# its wall time in every phase): never a reason to write on their own.
CLOCK_FIELDS = ("goodput", "goodputBreakdown")
# Status fields that follow the heartbeat; a change to these alone may wait.
PROGRESS_FIELDS = ("progress", *CLOCK_FIELDS)


async def reconcile(
    deps: Deps, namespace: str, name: str, woken_at: float | None = None
) -> float | None:
    """Reconcile once; returns seconds until the next reconcile, None when the job is gone.

    At most `RECONCILE_SLOTS` reconciles run at once (in the order they asked). `woken_at`
    (monotonic) is when an event woke the job: wake-to-start latency includes the wait for a
    slot, the reconcile's duration does not.
    """
    async with deps.reconcile_slots:
        if woken_at is not None:
            deps.metrics.wake_seconds.observe(time.monotonic() - woken_at)
        started = time.perf_counter()
        try:
            if deps.api.down:
                await _api_back(deps)
            return await _reconcile(deps, namespace, name)
        except UnavailableError as err:
            # Only an API that does not answer ends every job's heartbeat clock; one job's
            # throttled or refused request stays that job's retry.
            deps.api.down = deps.api.down or err.unreachable
            raise
        finally:
            deps.metrics.reconcile_seconds.observe(time.perf_counter() - started)


async def _api_back(deps: Deps) -> None:
    """After an outage, plan nothing until the API answers: the cache and every heartbeat in
    it are as old as the outage, and no trainer could renew its heartbeat meanwhile.

    One probe at a time: a thousand jobs retrying do not send a thousand probes to an
    apiserver that is coming back; those queued behind a probe that succeeded go on at once.
    """
    async with deps.api.probe_lock:
        if not deps.api.down:
            return
        await deps.run(deps.reader.api_answers)
        deps.api.down = False
        deps.api.reachable_since = deps.clock()
        for informer in deps.informers:  # not a backoff's worth later
            informer.retry_now()


async def _reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    key = (namespace, name)
    view = deps.view
    if view is None:
        # Not attached yet (kopf runs the start-up handler that attaches it before it spawns
        # any daemon, so the operator never gets here): planning on no cache would take the
        # job for deleted. The job waits for the cache instead.
        return CACHE_WAIT_SECONDS
    # The cache's reads are in memory, and kopf changes it in the event loop: read here, in
    # the loop, never in a worker thread.
    body = _fresher(deps, key, view.job_body(namespace, name))
    if body is None:
        deps.forget(key)  # its claims too; its daemon's end wakes whoever waits for its pools
        return None
    if _awaits_finalizer(deps, key, body):
        return FINALIZER_POLL_SECONDS
    try:
        observed = observe(view, body, partial(deps.jobs.parse, key))
    except InvalidJobError as err:
        await _report_invalid(deps, body, err)
        return INVALID_SPEC_RETRY_SECONDS
    observed = with_tails(observed, await _tails(deps, namespace, tails_to_read(observed)))
    now = deps.clock()
    deps.pools.claim(key, observed.job.status)  # what it held before: rebuilt after a restart
    observed = replace(
        observed,
        tpu_short_since=deps.tpu_short_since,
        catalogue=deps.catalogue.catalogue if deps.catalogue else None,
        node_blames=ledger_rows(deps),
        site_rules=deps.site_rules,
        heartbeats_seen_since=deps.heartbeats_seen_since(now),
    )
    # Most plans keep the placement they had; those plan without the placement lock, so a
    # thousand running jobs do not queue behind one another. A plan that places pools is made
    # again under the lock, on the claims as they are then (plans are pure: same inputs, same
    # plan), and its claim is taken in that same step.
    try:
        result = await _plan(deps, observed, key, now)
        released = None
        if _places(result, observed):
            async with deps.pools.lock:
                result = await _plan(deps, observed, key, now)
                released = deps.pools.claim(key, result.status)
    except TimeoutError:
        return await _report_slow_plan(deps, body, observed)
    if released is None:
        released = deps.pools.claim(key, result.status)
    written = await _write_status(deps, key, body, result, old=observed.job.status, now=now)
    if result.ledger_blame is not None:
        await remember_blame(deps, result.ledger_blame)
    try:
        if _has_effects(result):  # most reconciles have none: no hop to a worker thread
            await deps.run(_act, deps, body, result)
    except PodsRefusedError as err:
        _tell(deps, namespace, name, result)
        return await _report_refused(deps, written, err)
    _tell(deps, namespace, name, result, written=written is not body)
    _let_go(deps, released, observed.job.spec.tpu.accelerator, observed.job.spec.tpu.topology)
    finished = result.status.phase in (Phase.SUCCEEDED, Phase.FAILED)
    deps.wakes.settled(key, finished=finished, waiting_for=_waiting_for(result, observed))
    if finished:
        deps.jobs.forget_parse(key)
    return result.requeue_after


def _awaits_finalizer(deps: Deps, key: JobKey, body: dict[str, Any]) -> bool:
    """Whether a job created moments ago still lacks kopf's finalizer (see `Deps.finalizer`).

    Only for the first `FINALIZER_WAIT_SECONDS` of the job's life as the apiserver's clock
    tells it: a finalizer that never comes (a patch refused) delays the job, never stops it,
    and a clock behind the apiserver's (a negative age) waits for nothing.
    """
    meta = body.get("metadata") or {}
    finalizer = deps.finalizer
    if (
        finalizer is None
        or finalizer in (meta.get("finalizers") or ())
        or meta.get("deletionTimestamp")
    ):
        deps.jobs.awaiting_finalizer.discard(key)
        return False
    try:
        created = dt.datetime.fromisoformat(str(meta.get("creationTimestamp")))
    except ValueError:
        return False
    age = (deps.clock() - created).total_seconds()
    if not 0 <= age < FINALIZER_WAIT_SECONDS:
        deps.jobs.awaiting_finalizer.discard(key)
        return False
    deps.jobs.awaiting_finalizer.add(key)
    return True


async def _plan(deps: Deps, observed: Observed, key: JobKey, now: dt.datetime) -> Plan:
    """Plan in a worker thread within the budget, avoiding the pools other jobs hold now."""
    seen = replace(observed, busy_pools=observed.busy_pools | deps.pools.claimed_by_others(key))
    return await asyncio.wait_for(
        deps.run(partial(plan, seen, now=now, settings=deps.settings)),
        timeout=deps.plan_budget_seconds,
    )


def _places(result: Plan, observed: Observed) -> bool:
    """Whether the plan chose pools: its placement or its warm spares differ from the job's."""
    new, old = result.status, observed.job.status
    return new.current_attempt.placement != old.current_attempt.placement or {
        s.node_pool for s in new.spares
    } != {s.node_pool for s in old.spares}


def _fresher(deps: Deps, key: JobKey, cached: dict[str, Any] | None) -> dict[str, Any] | None:
    """The cache's body, or the one this operator last wrote when the watch is behind."""
    if cached is None:
        return None  # deleted: what was written before no longer matters
    mine = deps.jobs.written.get(key)
    best = newer(cached, mine)
    if best is cached:
        deps.jobs.written.pop(key, None)
    return dict(best) if best is not None else None


async def _write_status(
    deps: Deps,
    key: JobKey,
    body: dict[str, Any],
    result: Plan,
    *,
    old: TPUTrainingJobStatus,
    now: dt.datetime,
) -> dict[str, Any]:
    """Write the new status unless nothing changed, only the clock moved, or only progress
    changed too recently.

    A thousand jobs waiting for pools would otherwise each rewrite their goodput breakdown
    every progress interval, though nothing happened to them: the breakdown is brought up to
    date by the next write that has another reason (progress, a condition, the phase).
    """
    if result.status == old:  # equal models dump equal: most reconciles change nothing
        return body
    new_status = status_patch(result.status)
    old_status = deps.jobs.dump(key, old)  # `body`'s status, as observe parsed it
    if new_status == old_status:
        return body
    effects = _has_effects(result)
    if _only_changed(old_status, new_status, CLOCK_FIELDS) and not effects:
        return body
    if _only_changed(old_status, new_status, PROGRESS_FIELDS) and not effects:
        last = deps.jobs.progress_written.get(key)
        if last is not None and (now - last).total_seconds() < deps.wakes.progress_interval_seconds:
            return body
    written = await deps.run(deps.writer.write_status, body, new_status)
    deps.jobs.written[key] = written
    deps.jobs.progress_written[key] = now
    return written


def _only_changed(old: dict[str, Any], new: dict[str, Any], fields: tuple[str, ...]) -> bool:
    def rest(status: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in status.items() if k not in fields}

    return rest(old) == rest(new)


def _has_effects(result: Plan) -> bool:
    return bool(
        result.create
        or result.delete_pods
        or result.rejoin_pods
        or result.mark_nodes
        or result.events
        or result.delete_job
        or result.fence_attempt is not None
        or result.workload is not None
    )


def _waiting_for(result: Plan, observed: Observed) -> Shape | None:
    if not reports.waits_for_pool(result.status):
        return None
    return (observed.job.spec.tpu.accelerator, observed.job.spec.tpu.topology)


def _let_go(
    deps: Deps, pools: list[str], accelerator: str | None = None, topology: str | None = None
) -> None:
    """Pools a job no longer claims: wake a waiting job for each that no pod still holds."""
    view = deps.view
    if not pools or view is None or accelerator is None or topology is None:
        return
    free = [p for p in pools if not view.pool_holders(p)]
    if free:
        deps.wakes.pool_freed((accelerator, topology), at=time.monotonic(), count=len(free))


def release_pools(deps: Deps, pools: list[str], tpu: Any) -> None:
    """`_let_go` for a job whose daemon stopped; `tpu` is its spec.tpu as the watch shows it."""
    accelerator, topology = tpu.get("accelerator"), tpu.get("topology")
    _let_go(
        deps, pools, str(accelerator) if accelerator else None, str(topology) if topology else None
    )


async def _tails(deps: Deps, namespace: str, pods: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Log tails of failed pods, each read once under the key `tails_to_read` gives it: a
    failed container's log does not change (keyed by pod uid, so a job re-applied under its
    old name never gets an old tail; a reported failure's by uid and attempt)."""
    missing = [(name, key) for name, key in pods if key not in deps.log_tails]
    for name, key in missing:
        deps.log_tails[key] = await deps.run(deps.reader.log_tail, namespace, name)
    while len(deps.log_tails) > TAIL_CACHE_SIZE:
        deps.log_tails.popitem(last=False)
    return [(name, deps.log_tails.get(key, "")) for name, key in pods]


class PodsRefusedError(Exception):
    """The apiserver refused to create a pod: quota, an admission webhook, Pod Security."""

    def __init__(self, pod: str, cause: KubeError) -> None:
        super().__init__(f"pod {pod}: {cause.reason}: {cause.message}")
        self.pod = pod
        self.cause = cause


def _create_all(deps: Deps, objects: tuple[dict[str, Any], ...], job_uid: str) -> None:
    for obj in objects:
        meta = obj["metadata"]
        what = f"{obj['kind']}/{meta['namespace']}/{meta['name']}"
        if deps.recent.fresh(what):
            continue  # created moments ago; the watch has not shown it yet
        try:
            if not deps.writer.create(obj) and obj["kind"] == "Pod":
                _check_owner(deps, meta["namespace"], meta["name"], job_uid)
            deps.recent.note(what)
        except (ForbiddenError, InvalidError) as err:
            raise PodsRefusedError(obj["metadata"]["name"], err) from err
        except KubeError as err:
            if err.status != 400:  # an admission webhook's denial
                raise
            raise PodsRefusedError(obj["metadata"]["name"], err) from err


def _check_owner(deps: Deps, namespace: str, pod: str, job_uid: str) -> None:
    """A pod of the name this job needs exists: fine if it is this job's, otherwise the job
    cannot start until it goes, and the status says so (never a silent wait)."""
    owners = deps.writer.pod_owner_uids(namespace, pod)
    if owners and job_uid in owners:
        return
    raise PodsRefusedError(
        pod,
        KubeError(
            409,
            "AlreadyExists",
            "a pod of this name exists and is not this job's (left by an "
            "earlier job of the same name, e.g. deleted with --cascade=orphan?): delete it and "
            "the job starts",
        ),
    )


async def _report_refused(deps: Deps, body: dict[str, Any], err: PodsRefusedError) -> float:
    """Say in the status why the attempt cannot start; retry with a backoff, never silently.

    The status was already written by this reconcile; this second write happens only on this
    error path, so the reason shows within the reconcile that met it.
    """
    report = reports.pods_refused(parse_status(body.get("status")), str(err), now=deps.clock())
    if report is not None:
        status, event = report
        await deps.run(deps.writer.write_status, body, status_patch(status))
        await deps.run(deps.writer.event, body, event)
    return REFUSED_RETRY_SECONDS


def _act(deps: Deps, body: dict[str, object], result: Plan) -> None:
    meta = body["metadata"]
    assert isinstance(meta, dict)
    namespace, name = str(meta["namespace"]), str(meta["name"])
    for deletion in result.delete_pods:
        deps.writer.delete_pod(namespace, deletion)
    if result.fence_attempt is not None:
        _lease_access(deps, namespace)
        lease = next(o for o in result.create if o["kind"] == "Lease")
        fenced = f"fence/{namespace}/{lease['metadata']['name']}/{result.fence_attempt}"
        if not deps.recent.fresh(fenced):
            try:
                deps.writer.fence(lease, result.fence_attempt)
            except ForbiddenError as err:  # no Lease rights here: say so, as for a pod
                raise PodsRefusedError(lease["metadata"]["name"], err) from err
            deps.recent.note(fenced)
            # The fence made or found the Lease: creating it again would only be refused.
            deps.recent.note(f"Lease/{namespace}/{lease['metadata']['name']}")
    for rejoin in result.rejoin_pods:  # after the fence: the old attempt can no longer commit
        deps.writer.rejoin_pod(namespace, rejoin)
    _create_all(deps, result.create, str(meta.get("uid") or ""))
    for mark in result.mark_nodes:
        deps.writer.mark_node(mark, name)
    if result.workload is not None and deps.workloads is not None:
        deps.workloads.write(namespace, result.workload)
    if result.delete_job:
        deps.writer.delete_job(body)
    for event in result.events:
        # A journaled Event is told again until the status that clears it is seen: log it
        # only when this call told it.
        if deps.writer.event(body, event):
            log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)


def _lease_access(deps: Deps, namespace: str) -> None:
    """Bind the operator's Lease-writer role to itself here, once per namespace and process.

    Never in the system namespaces, where Leases elect leaders and carry node heartbeats: a job
    there cannot start (its Lease is refused, which the job's status says).
    """
    access = deps.lease_access
    if access is None or namespace in labels.SYSTEM_NAMESPACES:
        return
    done = f"lease-access/{namespace}"
    if deps.recent.fresh(done):
        return
    deps.writer.bind_cluster_role(
        namespace, access.binding, access.role, access.account, access.account_namespace
    )
    deps.recent.note(done)


def _tell(deps: Deps, namespace: str, name: str, result: Plan, *, written: bool = True) -> None:
    status = result.status
    if result.diagnosis is not None:
        d = result.diagnosis
        deps.metrics.record_failure(
            str(d.failure_class), str(d.code), restarted=status.phase is Phase.RECOVERING
        )
    if result.recovery_seconds is not None:
        deps.metrics.record_recovery(result.recovery_seconds)
    deps.metrics.record_job(
        namespace, name, status.phase, status.goodput, status.failed_node_budget_left
    )
    if status.goodput_breakdown is not None:
        deps.metrics.record_breakdown(namespace, name, status.goodput_breakdown, written=written)


async def _report_slow_plan(deps: Deps, body: dict[str, Any], observed: Observed) -> float:
    """Planning overran its budget: say so on this job and let every other job go on."""
    status = reports.planning_slow(
        parse_status(body.get("status")),
        budget_seconds=deps.plan_budget_seconds,
        retry_seconds=SLOW_PLAN_RETRY_SECONDS,
        patterns=[r.message_pattern for r in observed.job.spec.recovery.rules if r.message_pattern],
        now=deps.clock(),
    )
    await deps.run(deps.writer.write_status, body, status_patch(status))
    return SLOW_PLAN_RETRY_SECONDS


async def _report_invalid(deps: Deps, body: dict[str, object], err: InvalidJobError) -> None:
    """A spec the schema let through but the operator cannot run: say so in a condition."""
    status = reports.invalid_spec(
        parse_status(body.get("status")),  # type: ignore[arg-type]
        err.errors,
        now=deps.clock(),
    )
    if status is not None:
        await deps.run(deps.writer.write_status, body, status_patch(status))
