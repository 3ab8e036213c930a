"""The only module with kopf decorators: one daemon per job, woken by what concerns it.

A job's daemon reconciles it in a loop, so reconciles of one job never overlap; it sleeps until
the planner's requeue time or until an event wakes it (`tpujob.controller.wakeups` decides whom
an event concerns). Reconciles read the cluster from a watch-fed cache (`tpujob.kube.cache`):
the jobs (and Kueue's objects) from kopf's indexes, pods, nodes and heartbeat Leases from the
operator's own watches (`tpujob.controller.watches`); kopf starts no handler before every index
has had its first listing, nor before the start-up handler that waits for the own watches'.
Errors are translated here (`retry_delay`): a ConflictError means "redo soon on fresh data", an
unreachable apiserver is retried in about a second, anything else backs off.
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
from tpujob.controller import watches
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
    async def attach_cache(memo: Deps, **indexes: Any) -> None:
        """kopf hands every handler its indexes as keyword arguments named after them; the
        operator's own watches fill the rest, and have listed once when this returns."""
        own = watches.own_indexes(memo)
        memo.view = watches.cached_view(
            memo,
            own,
            jobs=indexes["tpujob_jobs"],
            workloads=indexes.get("tpujob_workloads"),
            flavors=indexes.get("tpujob_flavors"),
        )
        if memo.watch_api is not None:
            loop = asyncio.get_running_loop()
            await watches.start(
                memo, watches.informers(memo, own, memo.watch_api, memo.namespaces, loop)
            )

    @kopf.on.cleanup(registry=registry)
    def stop_watches(memo: Deps, **_: Any) -> None:
        watches.stop(memo)

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


def _register_indexes(registry: kopf.OperatorRegistry) -> None:
    """The jobs' index (`tpujob.kube.cache.job_record`); pods, nodes and Leases come through
    the operator's own watches (`tpujob.controller.watches`)."""

    # A coroutine: kopf runs a plain function in its thread pool, and the hop there and back
    # cost more than the copy of one job's body, at every status write of every job.
    @kopf.index(GROUP, VERSION, PLURAL, id="tpujob_jobs", registry=registry)
    async def tpujob_jobs(body: kopf.Body, **_: Any) -> Any:
        return cache.job_record(body)


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
