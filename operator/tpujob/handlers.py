"""The only module with kopf decorators: one daemon per job, woken by what changes around it.

A job's daemon reconciles it in a loop, so reconciles of one job never overlap; it sleeps until
the planner's requeue time or until an event about the job's pods, its heartbeat Lease or any
node wakes it. Typed errors are translated here: a ConflictError means "redo now on fresh data",
other API errors are retried after a short pause. `register` applies the decorators to a
registry it is given, so importing this module has no side effects.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from tpujob import labels
from tpujob.api import GROUP, PLURAL, VERSION
from tpujob.controller import Deps, reconcile
from tpujob.kube.errors import ConflictError, KubeError

ERROR_RETRY_SECONDS = 2.0


def register(registry: kopf.OperatorRegistry) -> None:
    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.posting.level = logging.WARNING
        settings.watching.server_timeout = 60
        settings.watching.client_timeout = 90
        settings.watching.connect_timeout = 10
        settings.networking.request_timeout = 30
        settings.persistence.finalizer = f"{GROUP}/operator"

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_via_client(**kwargs)

    @kopf.daemon(GROUP, VERSION, PLURAL, registry=registry, cancellation_timeout=10.0)
    async def run_job(*, name: str, namespace: str | None, stopped: kopf.DaemonStopped,
                      memo: Any, logger: kopf.Logger, **_: Any) -> None:
        assert isinstance(memo, Deps) and namespace is not None
        wake = memo.waker(namespace, name)
        try:
            while not stopped:
                wake.clear()
                try:
                    delay = await reconcile(memo, namespace, name)
                except ConflictError:
                    delay = 0.0
                except KubeError as err:
                    logger.warning(f"reconcile failed, retrying: {err}")
                    delay = ERROR_RETRY_SECONDS
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
