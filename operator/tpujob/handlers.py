"""The only module with kopf decorators: one daemon per job, woken by what changes around it.

A job's daemon reconciles it in a loop, so reconciles of one job never overlap; it sleeps until
the planner's requeue time or until an event about the job's pods, its heartbeat Lease or any
node wakes it. Errors are translated here (`retry_delay`): a ConflictError means "redo soon on
fresh data", an unreachable apiserver is retried in about a second, anything else backs off.
`register` applies the decorators to a registry it is given, so importing this module has no
side effects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping
from typing import Any

import kopf

from tpujob import labels
from tpujob.api import GROUP, PLURAL, VERSION
from tpujob.controller import Deps, reconcile, refresh_catalogue
from tpujob.kube.errors import ConflictError, KubeError, UnavailableError

ERROR_RETRY_SECONDS = 2.0
MAX_ERROR_RETRY_SECONDS = 60.0


def retry_delay(err: Exception, failures: int, jitter: float) -> float:
    """Seconds before a failed reconcile is redone; `jitter` is uniform in [0, 1).

    A Conflict is redone at once on fresh data, after a jittered pause so that replicas or
    handlers that raced do not race again in step. An unreachable or overloaded apiserver is
    retried soon (it is usually back in seconds); other API errors and bugs back off
    exponentially, so one broken job cannot spin the operator.
    """
    if isinstance(err, ConflictError):
        return 0.05 + 0.45 * jitter
    base = 1.0 if isinstance(err, UnavailableError) else ERROR_RETRY_SECONDS
    delay: float = min(MAX_ERROR_RETRY_SECONDS, base * 2.0 ** min(failures - 1, 6))
    return delay * (0.75 + 0.5 * jitter)


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 60
        settings.watching.client_timeout = 90
        settings.watching.connect_timeout = 10
        settings.networking.request_timeout = 30
        settings.persistence.finalizer = f"{GROUP}/operator"

    @kopf.on.startup(registry=registry)
    async def start_catalogue(memo: Any, **_: Any) -> None:
        assert isinstance(memo, Deps)
        if memo.catalogue is not None:
            memo.background.append(asyncio.create_task(refresh_catalogue(memo)))

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=10.0)
    async def run_job(*, name: str, namespace: str | None, stopped: kopf.DaemonStopped,
                      memo: Any, logger: kopf.Logger, **_: Any) -> None:
        assert isinstance(memo, Deps) and namespace is not None
        wake = memo.waker(namespace, name)
        try:
            failures = 0
            while not stopped:
                wake.clear()
                try:
                    delay = await reconcile(memo, namespace, name)
                    failures = 0
                except Exception as err:
                    failures += 1
                    delay = retry_delay(err, failures, random.random())
                    if not isinstance(err, ConflictError):
                        logger.warning(f"reconcile failed ({failures} in a row), retrying in "
                                       f"{delay:.1f}s: {err}", exc_info=not isinstance(
                                           err, KubeError))
                if delay is None:
                    return
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), timeout=delay)
        finally:
            memo.wakers.pop((namespace, name), None)

    @kopf.on.event("", "v1", "pods", labels={labels.JOB: kopf.PRESENT}, registry=registry)
    async def pod_changed(*, namespace: str | None, labels: Mapping[str, str], memo: Any,
                          **_: Any) -> None:
        memo.wake(namespace, labels[_JOB_LABEL])

    @kopf.on.event("coordination.k8s.io", "v1", "leases", labels={labels.JOB: kopf.PRESENT},
                   registry=registry)
    async def heartbeat(*, namespace: str | None, labels: Mapping[str, str], memo: Any,
                        **_: Any) -> None:
        memo.wake(namespace, labels[_JOB_LABEL])

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_changed(*, memo: Any, **_: Any) -> None:
        memo.wake_all()


_JOB_LABEL = labels.JOB
