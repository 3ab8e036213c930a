"""One reconcile of one job: observe -> plan -> write status once -> act -> tell.

The async shell around the pure planner. Client calls are blocking, so they run in worker
threads; the status is written before any effect, and Events and metrics only after the status
write succeeded (a failed write leaves nothing half-told).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar

from tpujob.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    InvalidJobError,
    Phase,
    TPUTrainingJobStatus,
    parse_status,
    status_patch,
)
from tpujob.gcp.client import CatalogueSource
from tpujob.kube.apply import Writer
from tpujob.kube.errors import ForbiddenError, InvalidError, KubeError
from tpujob.kube.observe import Reader, observe
from tpujob.metrics import Metrics
from tpujob.node_health import track_tpu_shortfall
from tpujob.observed import Observed
from tpujob.plan import EventSpec, Plan, PlannerSettings
from tpujob.planning import plan

log = logging.getLogger("tpujob.controller")
INVALID_SPEC_RETRY_SECONDS = 300.0
# A refused pod is retried this often: a raised quota or a fixed policy takes effect soon,
# and each retry is one create call.
REFUSED_RETRY_SECONDS = 10.0
SLOW_PLAN_RETRY_SECONDS = 60.0
API_THREADS = 16
T = TypeVar("T")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class Deps:
    """What the handlers share (kopf's memo); copying returns the same object."""

    reader: Reader
    writer: Writer
    metrics: Metrics = field(default_factory=Metrics)
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    clock: Callable[[], dt.datetime] = utc_now
    wakers: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    # Since when each node's allocatable TPUs have been below capacity: the Node object keeps
    # no such time, so the operator remembers it (a restart only restarts the grace).
    tpu_short_since: dict[str, dt.datetime] = field(default_factory=dict)
    # Jobs whose last reconcile found them finished: node events no longer wake them.
    finished: set[tuple[str, str]] = field(default_factory=set)
    # The placement authority: pool -> the job that holds it, taken under `placement_lock`
    # in the same step as the plan that chose it, so two jobs planned at once never pick one
    # pool. Rebuilt after a restart from each job's recorded placement (and, meanwhile, the
    # pods that exist mark their pools busy).
    pool_claims: dict[str, tuple[str, str]] = field(default_factory=dict)
    placement_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Blocking client calls and planning run here, not in the loop's default executor (six
    # threads on a small pod, shared with kopf): sized for many jobs reconciling at once.
    executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(
        max_workers=API_THREADS, thread_name_prefix="tpujob"))
    # Longest a plan (diagnosis included) may take; user rules are linear-time, so this is a
    # guard against the unforeseen, and the loop stays free meanwhile.
    plan_budget_seconds: float = 10.0
    # The optional Cloud TPU zone catalogue (advice only); refreshed by `refresh_catalogue`.
    catalogue: CatalogueSource | None = None
    catalogue_refresh_seconds: float = 6 * 3600.0
    background: list[asyncio.Task[None]] = field(default_factory=list)  # kept, not collected

    def claim(self, key: tuple[str, str], status: TPUTrainingJobStatus | None) -> None:
        """Record the pools `key`'s status holds (none once it finished or is gone)."""
        for pool in [p for p, owner in self.pool_claims.items() if owner == key]:
            del self.pool_claims[pool]
        if status is None or status.phase in (Phase.SUCCEEDED, Phase.FAILED):
            return
        for slot in status.current_attempt.placement:
            self.pool_claims.setdefault(slot.node_pool, key)

    def claimed_by_others(self, key: tuple[str, str]) -> frozenset[str]:
        return frozenset(p for p, owner in self.pool_claims.items() if owner != key)

    def __copy__(self) -> Deps:
        return self

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call in the operator's executor."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def waker(self, namespace: str, name: str) -> asyncio.Event:
        return self.wakers.setdefault((namespace, name), asyncio.Event())

    def wake(self, namespace: str, name: str) -> None:
        if (event := self.wakers.get((namespace, name))) is not None:
            event.set()

    def wake_all(self) -> None:
        """Wake every job that may care about a cluster-wide change (finished jobs do not)."""
        for key, event in self.wakers.items():
            if key not in self.finished:
                event.set()


async def refresh_catalogue(deps: Deps) -> None:
    """Keep the zone catalogue fresh for as long as the operator runs (a task of its own:
    a slow or unreachable Cloud TPU API never holds a reconcile)."""
    source = deps.catalogue
    if source is None:
        return
    while True:
        await deps.run(source.refresh)
        await asyncio.sleep(deps.catalogue_refresh_seconds)


async def reconcile(deps: Deps, namespace: str, name: str) -> float | None:
    """Reconcile once; returns seconds until the next reconcile, None when the job is gone."""
    body = await deps.run(deps.reader.job_body, namespace, name)
    if body is None:
        deps.metrics.forget_job(namespace, name)
        deps.finished.discard((namespace, name))
        deps.claim((namespace, name), None)
        return None
    try:
        observed = await deps.run(observe, deps.reader, body)
    except InvalidJobError as err:
        await _report_invalid(deps, body, err)
        return INVALID_SPEC_RETRY_SECONDS
    now = deps.clock()
    deps.tpu_short_since = track_tpu_shortfall(deps.tpu_short_since, observed.nodes.values(),
                                               now=now)
    key = (namespace, name)
    async with deps.placement_lock:
        deps.claim(key, observed.job.status)  # what it held before: rebuilt after a restart
        observed = replace(observed, tpu_short_since=deps.tpu_short_since,
                       catalogue=deps.catalogue.catalogue if deps.catalogue else None,
                           busy_pools=observed.busy_pools | deps.claimed_by_others(key))
        try:
            result = await asyncio.wait_for(
                deps.run(partial(plan, observed, now=now, settings=deps.settings)),
                timeout=deps.plan_budget_seconds)
        except TimeoutError:
            return await _report_slow_plan(deps, body, observed)
        deps.claim(key, result.status)
    new_status = status_patch(result.status)
    written = body
    if new_status != status_patch(parse_status(body.get("status"))):
        written = await deps.run(deps.writer.write_status, body, new_status)
    try:
        await deps.run(_act, deps, body, result)
    except PodsRefusedError as err:
        _tell(deps, namespace, name, result)
        return await _report_refused(deps, written, err)
    _tell(deps, namespace, name, result)
    if result.status.phase in (Phase.SUCCEEDED, Phase.FAILED):
        deps.finished.add((namespace, name))
    else:
        deps.finished.discard((namespace, name))
    return result.requeue_after


class PodsRefusedError(Exception):
    """The apiserver refused to create a pod: quota, an admission webhook, Pod Security."""

    def __init__(self, pod: str, cause: KubeError) -> None:
        super().__init__(f"pod {pod}: {cause.reason}: {cause.message}")
        self.pod = pod
        self.cause = cause


def _create_all(deps: Deps, objects: tuple[dict[str, Any], ...]) -> None:
    for obj in objects:
        try:
            deps.writer.create(obj)
        except (ForbiddenError, InvalidError) as err:
            raise PodsRefusedError(obj["metadata"]["name"], err) from err
        except KubeError as err:
            if err.status != 400:  # an admission webhook's denial
                raise
            raise PodsRefusedError(obj["metadata"]["name"], err) from err


async def _report_refused(deps: Deps, body: dict[str, Any], err: PodsRefusedError) -> float:
    """Say in the status why the attempt cannot start; retry with a backoff, never silently.

    The status was already written by this reconcile; this second write happens only on this
    error path, so the reason shows within the reconcile that met it.
    """
    status = parse_status(body.get("status"))
    previous = status.condition(ConditionType.PODS_REFUSED)
    message = str(err)[:1000]
    status = status.with_condition(Condition(
        type=ConditionType.PODS_REFUSED, status=ConditionStatus.TRUE, reason="FailedCreate",
        message=message, last_transition_time=deps.clock()))
    if previous is None or previous.status != ConditionStatus.TRUE or \
            previous.message != message:
        await deps.run(deps.writer.write_status, body, status_patch(status))
        await deps.run(deps.writer.event, body, EventSpec("Warning", "FailedCreate",
                                                                   message))
    return REFUSED_RETRY_SECONDS


def _act(deps: Deps, body: dict[str, object], result: Plan) -> None:
    meta = body["metadata"]
    assert isinstance(meta, dict)
    namespace, name = str(meta["namespace"]), str(meta["name"])
    for deletion in result.delete_pods:
        deps.writer.delete_pod(namespace, deletion)
    if result.fence_attempt is not None:
        lease = next(o for o in result.create if o["kind"] == "Lease")
        deps.writer.fence(lease, result.fence_attempt)
    _create_all(deps, result.create)
    for mark in result.mark_nodes:
        deps.writer.mark_node(mark, name)
    if result.delete_job:
        deps.writer.delete_job(body)
    for event in result.events:
        deps.writer.event(body, event)


def _tell(deps: Deps, namespace: str, name: str, result: Plan) -> None:
    status = result.status
    for event in result.events:
        log.info("%s/%s %s: %s", namespace, name, event.reason, event.message)
    if result.diagnosis is not None:
        d = result.diagnosis
        deps.metrics.record_failure(str(d.failure_class), str(d.code),
                                    restarted=status.phase is Phase.RECOVERING)
    if result.recovery_seconds is not None:
        deps.metrics.record_recovery(result.recovery_seconds)
    deps.metrics.record_job(namespace, name, status.phase, status.goodput,
                            status.failed_node_budget_left)


async def _report_slow_plan(deps: Deps, body: dict[str, Any], observed: Observed) -> float:
    """Planning overran its budget: say so on this job and let every other job go on."""
    rules = [r.message_pattern for r in observed.job.spec.recovery.rules if r.message_pattern]
    message = (f"planning this job took longer than {deps.plan_budget_seconds:.0f}s and was "
               f"abandoned; it is retried in {SLOW_PLAN_RETRY_SECONDS:.0f}s")
    if rules:
        message += "; spec.recovery.rules patterns: " + ", ".join(repr(r) for r in rules)
    status = parse_status(body.get("status")).with_condition(Condition(
        type=ConditionType.PLANNING_SLOW, status=ConditionStatus.TRUE,
        reason="PlanningBudgetExceeded", message=message[:1000],
        last_transition_time=deps.clock()))
    await deps.run(deps.writer.write_status, body, status_patch(status))
    return SLOW_PLAN_RETRY_SECONDS


async def _report_invalid(deps: Deps, body: dict[str, object], err: InvalidJobError) -> None:
    """A spec the schema let through but the operator cannot run: say so in a condition."""
    status = parse_status(body.get("status"))  # type: ignore[arg-type]
    message = "; ".join(f"{e.path}: {e.message}" for e in err.errors)[:4000]
    status = status.with_condition(Condition(
        type=ConditionType.SPEC_VALID, status=ConditionStatus.FALSE, reason="InvalidSpec",
        message=message, last_transition_time=deps.clock())).model_copy(
        update={"phase": Phase.PENDING})
    new = status_patch(status)
    if new != status_patch(parse_status(body.get("status"))):  # type: ignore[arg-type]
        await deps.run(deps.writer.write_status, body, new)
