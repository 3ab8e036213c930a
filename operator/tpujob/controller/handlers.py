"""The only module with kopf decorators: one daemon per job, woken by what concerns it.

A job's daemon reconciles it in a loop, so reconciles of one job never overlap; it sleeps until
the planner's requeue time or until an event wakes it (`tpujob.controller.wakeups` decides whom
an event concerns). The watches also feed kopf indexes (`tpujob.kube.cache`), from which
reconciles read instead of asking the API; kopf starts no handler before every index has had its
first listing. Errors are translated here (`retry_delay`): a ConflictError means "redo soon on fresh
data", an unreachable apiserver is retried in about a second, anything else backs off.
`register` applies the decorators to a registry it is given, so importing this module has no
side effects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from tpujob.api import GROUP, PLURAL, VERSION, labels
from tpujob.controller.ledger_store import load_ledger
from tpujob.controller.reconcile import Deps, reconcile, release_pools
from tpujob.controller.sweeps import (
    check_for_ghosts,
    clear_orphaned_marks,
    refresh_catalogue,
    refresh_site_rules,
)
from tpujob.kube import cache, workloads
from tpujob.kube.errors import ConflictError, KubeError, UnavailableError
from tpujob.kube.workloads import FLAVORS, WORKLOADS
from tpujob.observed.nodes import down_now, note_tpu_shortfall, placeable
from tpujob.plan.failed_nodes import marked_by
from tpujob.plan.queueing import KUEUE_GROUP, KUEUE_VERSION

ERROR_RETRY_SECONDS = 2.0
MAX_ERROR_RETRY_SECONDS = 60.0
# An unreachable apiserver is asked again at least this often, so reconciles resume within
# seconds of its return (one probe at a time: `controller._api_back`).
MAX_UNAVAILABLE_RETRY_SECONDS = 8.0


def retry_delay(err: Exception, failures: int, jitter: float) -> float:
    """Seconds before a failed reconcile is redone; `jitter` is uniform in [0, 1).

    A Conflict is redone at once on fresh data, after a jittered pause so that replicas or
    handlers that raced do not race again in step. An unreachable or overloaded apiserver is
    retried soon (it is usually back in seconds); other API errors and bugs back off
    exponentially, so one broken job cannot spin the operator.
    """
    if isinstance(err, ConflictError):
        return 0.05 + 0.45 * jitter
    unavailable = isinstance(err, UnavailableError)
    base = 1.0 if unavailable else ERROR_RETRY_SECONDS
    cap = MAX_UNAVAILABLE_RETRY_SECONDS if unavailable else MAX_ERROR_RETRY_SECONDS
    delay: float = min(cap, base * 2.0 ** min(failures - 1, 6))
    return delay * (0.75 + 0.5 * jitter)


class NoDiffBase(kopf.DiffBaseStorage):
    """No essence of an object is kept or compared.

    kopf diffs every watch event of a resource it handles against the last handled state, a
    deep copy of the object, for on-create/on-update handlers. This operator has none (its
    reconciles compare what they need themselves), yet every status renewal of a thousand
    nodes, every pod and Lease event paid for that copy. The empty essence makes each diff
    empty, which only tells a daemon's idle timer (none here) that nothing changed.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return kopf.BodyEssence()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def register(registry: kopf.OperatorRegistry, *, kueue: bool = False) -> None:
    """`kueue`: also watch Kueue's Workloads and ResourceFlavors (`tpujob.plan.queueing`)."""

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 60
        settings.watching.client_timeout = 90
        settings.watching.connect_timeout = 10
        settings.networking.request_timeout = 30
        settings.persistence.finalizer = labels.FINALIZER
        # One line per watch event of every pod, node and Lease is noise at scale (and CPU):
        # kopf's own per-handler lines only when something went wrong.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)

    @kopf.on.startup(registry=registry)
    async def start_ledger(memo: Deps, **_: Any) -> None:
        await load_ledger(memo)

    @kopf.on.startup(registry=registry)
    async def start_sweeps(memo: Deps, **_: Any) -> None:
        if memo.catalogue is not None:
            memo.background.append(asyncio.create_task(refresh_catalogue(memo)))
        memo.background.append(asyncio.create_task(clear_orphaned_marks(memo)))
        memo.background.append(asyncio.create_task(refresh_site_rules(memo)))
        memo.background.append(asyncio.create_task(check_for_ghosts(memo)))

    _register_indexes(registry)
    if kueue:
        _register_kueue(registry)

    @kopf.on.startup(registry=registry)
    def attach_cache(memo: Deps, **indexes: Any) -> None:
        """kopf hands every handler the indexes as keyword arguments named after them."""
        memo.view = cache.CachedView(
            jobs=indexes["tpujob_jobs"],
            pods=indexes["tpujob_pods"],
            pools=indexes["tpujob_pools"],
            nodes=indexes["tpujob_nodes"],
            heartbeats=indexes["tpujob_heartbeats"],
            node_pods=indexes["tpujob_node_pods"],
            node_book=memo.node_book,
            **(
                {"workloads": indexes["tpujob_workloads"], "flavors": indexes["tpujob_flavors"]}
                if kueue
                else {}
            ),
        )

    @kopf.on.login(registry=registry)
    async def login(memo: Deps, **kwargs: Any) -> kopf.ConnectionInfo | kopf.AiohttpSession | None:
        """The client library's credentials, in a session with at most
        `Deps.kopf_connections` connections (kopf closes it when it logs in again)."""
        info = kopf.login_via_client(**kwargs)
        if info is None or not memo.kopf_connections:
            return info
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=memo.kopf_connections, ssl=info.as_ssl_context()),
            headers=info.as_http_headers(),
            proxy=info.proxy_url,
            trust_env=info.trust_env,
        )
        return kopf.AiohttpSession(
            server=info.server,
            priority=info.priority,
            default_namespace=info.default_namespace,
            expiration=info.expiration,
            aiohttp_session=session,
        )

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=10.0)
    async def run_job(
        *,
        name: str,
        namespace: str | None,
        stopped: kopf.DaemonStopped,
        memo: Deps,
        logger: kopf.Logger,
        spec: kopf.Spec,
        **_: Any,
    ) -> None:
        assert namespace is not None
        key = (namespace, name)
        wake = memo.wakes.waker(key)
        try:
            failures = 0
            while not stopped:
                woken = memo.wakes.woken_at.pop(key, None)
                woken = woken if wake.is_set() else None
                wake.clear()
                try:
                    delay = await reconcile(memo, namespace, name, woken_at=woken)
                    failures = 0
                except Exception as err:
                    failures += 1
                    delay = retry_delay(err, failures, random.random())
                    if not isinstance(err, ConflictError):
                        logger.warning(
                            f"reconcile failed ({failures} in a row), retrying in "
                            f"{delay:.1f}s: {err}",
                            exc_info=not isinstance(err, KubeError),
                        )
                if delay is None:
                    return
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), timeout=delay)
        finally:
            # Deleted, or this replica stops serving it: let its pools go (a replica that
            # takes over rebuilds the claim from the job's recorded placement), and forget the
            # rest kept of it (its book, its wakes, its metric series): a thousand deleted
            # jobs leave nothing behind.
            released = memo.pools.claim(key, None)
            memo.forget(key)
            release_pools(memo, released, spec.get("tpu") or {})

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def job_changed(
        *, namespace: str | None, name: str | None, meta: kopf.Meta, memo: Deps, **_: Any
    ) -> None:
        """A new job's daemon waits for kopf's finalizer (see `Deps.finalizer`): go on as
        soon as the watch shows it. Other changes of a job wait for its next reconcile."""
        key = (namespace or "", name or "")
        if key in memo.jobs.awaiting_finalizer and labels.FINALIZER in (
            meta.get("finalizers") or ()
        ):
            memo.jobs.awaiting_finalizer.discard(key)
            memo.wakes.wake(key, at=time.monotonic())

    @kopf.on.event("", "v1", "pods", labels={labels.JOB: kopf.PRESENT}, registry=registry)
    async def pod_changed(
        *,
        namespace: str | None,
        labels: Mapping[str, str],
        memo: Deps,
        body: kopf.Body,
        type: str | None,
        **_: Any,
    ) -> None:
        now = time.monotonic()
        memo.wakes.wake((namespace or "", labels[_JOB_LABEL]), at=now)
        # A pod that ended or went may free its pool for a job waiting for that shape.
        spec, status = body.get("spec") or {}, body.get("status") or {}
        selector = spec.get("nodeSelector") or {}
        pool = selector.get(_POOL_LABEL)
        ended = type == "DELETED" or status.get("phase") in ("Succeeded", "Failed")
        if (
            ended
            and pool
            and memo.view is not None
            and not memo.view.pool_holders(pool)
            and memo.pools.holder(pool) is None
        ):
            shape = (selector.get(_ACCELERATOR_LABEL), selector.get(_TOPOLOGY_LABEL))
            if shape[0] and shape[1]:
                memo.wakes.pool_freed((str(shape[0]), str(shape[1])), at=now)

    @kopf.on.event(
        "coordination.k8s.io", "v1", "leases", labels={labels.JOB: kopf.PRESENT}, registry=registry
    )
    async def heartbeat(
        *, namespace: str | None, name: str | None, labels: Mapping[str, str], memo: Deps, **_: Any
    ) -> None:
        key = (namespace or "", labels[_JOB_LABEL])
        # Parsed once, by the index (kopf updates indexes before it calls handlers).
        beat = memo.view.heartbeat(namespace or "", name or "") if memo.view else None
        if beat is not None and memo.wakes.heartbeat(key, beat, now=memo.clock()):
            memo.wakes.wake(key, at=time.monotonic())

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_changed(*, name: str | None, memo: Deps, type: str | None, **_: Any) -> None:
        """Wake the jobs with pods on this node or a placement on its pool, and the job that
        marked it bad; a healthy node of a pool nobody holds may also let a waiting job in.
        A status renewal that changed nothing the planner reads wakes no one."""
        if memo.view is None or not name:
            return
        if type == "DELETED":
            memo.node_book.note(name, None)
        if not memo.node_book.take_change(name):
            return
        now = time.monotonic()
        view = memo.view.node(name)  # parsed once, by the index; None once deleted
        memo.tpu_short_since = note_tpu_shortfall(
            memo.tpu_short_since, name, view, now=memo.clock()
        )
        concerned = set(memo.view.jobs_on_node(name))
        holder = memo.pools.holder(view.pool or "") if view is not None else None
        if holder is not None:
            concerned.add(holder)
        memo.wakes.wake_live(concerned, at=now)
        marker = marked_by(view.mark_reason) if view is not None and not down_now(view) else None
        if marker is not None:
            # The job that marked a node lost may take its mark off once the node is back,
            # finished or not: only it knows why, and nothing else would wake a finished job.
            memo.wakes.wake(marker, at=now)
        if (
            view is not None
            and view.pool
            and holder is None
            and view.accelerator
            and view.topology
            and placeable(view)
            and not memo.view.pool_holders(view.pool)
        ):
            memo.wakes.pool_freed((view.accelerator, view.topology), at=now)


def _register_indexes(registry: kopf.OperatorRegistry) -> None:
    """The watch-fed cache: each index maps a key to the parsed records of the objects under
    it (see `tpujob.kube.cache`); handlers receive each as a keyword argument named by its id."""
    job_pods = {labels.JOB: kopf.PRESENT}

    @kopf.index(GROUP, VERSION, PLURAL, id="tpujob_jobs", registry=registry)
    def tpujob_jobs(body: kopf.Body, **_: Any) -> Any:
        return cache.job_record(body)

    @kopf.index("", "v1", "pods", labels=job_pods, id="tpujob_pods", registry=registry)
    def tpujob_pods(body: kopf.Body, **_: Any) -> Any:
        return cache.pod_by_job(body)

    @kopf.index("", "v1", "pods", labels=job_pods, id="tpujob_pools", registry=registry)
    def tpujob_pools(body: kopf.Body, **_: Any) -> Any:
        return cache.pod_by_pool(body)

    @kopf.index("", "v1", "pods", labels=job_pods, id="tpujob_node_pods", registry=registry)
    def tpujob_node_pods(body: kopf.Body, **_: Any) -> Any:
        return cache.pod_by_node(body)

    @kopf.index("", "v1", "nodes", id="tpujob_nodes", registry=registry)
    def tpujob_nodes(body: kopf.Body, memo: Deps, **_: Any) -> Any:
        return cache.node_record(body, memo.node_book)

    @kopf.index(
        "coordination.k8s.io",
        "v1",
        "leases",
        labels=job_pods,
        id="tpujob_heartbeats",
        registry=registry,
    )
    def tpujob_heartbeats(body: kopf.Body, memo: Deps, **_: Any) -> Any:
        return cache.lease_record(body, memo.beat_book)


def _register_kueue(registry: kopf.OperatorRegistry) -> None:
    """Kueue's decisions on a job's Workload wake the job; flavors are read at placement."""
    job_workloads = {labels.JOB: kopf.PRESENT}

    @kopf.index(
        KUEUE_GROUP,
        KUEUE_VERSION,
        WORKLOADS,
        labels=job_workloads,
        id="tpujob_workloads",
        registry=registry,
    )
    def tpujob_workloads(body: kopf.Body, **_: Any) -> Any:
        return workloads.workload_record(body)

    @kopf.index(KUEUE_GROUP, KUEUE_VERSION, FLAVORS, id="tpujob_flavors", registry=registry)
    def tpujob_flavors(body: kopf.Body, **_: Any) -> Any:
        return workloads.flavor_record(body)

    @kopf.on.event(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, labels=job_workloads, registry=registry)
    async def workload_changed(
        *, namespace: str | None, labels: Mapping[str, str], memo: Deps, **_: Any
    ) -> None:
        memo.wakes.wake((namespace or "", labels[_JOB_LABEL]), at=time.monotonic())


_JOB_LABEL = labels.JOB
_POOL_LABEL = labels.NODEPOOL
_ACCELERATOR_LABEL = labels.ACCELERATOR
_TOPOLOGY_LABEL = labels.TOPOLOGY
