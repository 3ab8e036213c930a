"""The operator's own watches of its pods, its heartbeat Leases and every Node, and whom each
change of them wakes.

These are the kinds a large cluster changes all the time: a kubelet renews its node's status
every few seconds, trainers renew their heartbeats, a thousand jobs start together. Each kind
is listed and watched by an informer of its own (`tpujob.kube.informer`), selected on the
server by label, parsed once into the indexes `tpujob.kube.cache.CachedView` reads; the
handlers below run in the event loop right after the indexes took the change in, and decide
whom it concerns (`tpujob.controller.wakeups`). The jobs themselves (and Kueue's objects) are
few and still come through kopf, which runs each job's daemon.

Reconciles start only after every informer's first listing is in the indexes: `start` returns
then, and kopf spawns no daemon before its start-up handlers returned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubernetes import client

from tpujob.api import labels
from tpujob.controller.deps import Deps, Stream
from tpujob.kube import cache
from tpujob.kube.indexes import DELETED, Change, Indexer
from tpujob.kube.informer import Informer, Watched, namespace_filter
from tpujob.observed.nodes import down_now, note_tpu_shortfall, placeable
from tpujob.plan.failed_nodes import marked_by

Index = cache.Index


@dataclass(frozen=True)
class OwnIndexes:
    """The indexers of the three kinds; their indexes make most of the cached view."""

    pods: Indexer
    nodes: Indexer
    leases: Indexer


def own_indexes(deps: Deps) -> OwnIndexes:
    return OwnIndexes(
        pods=Indexer(
            {"pods": cache.pod_by_job, "pools": cache.pod_by_pool, "node_pods": cache.pod_by_node}
        ),
        nodes=Indexer({"nodes": partial(cache.node_record, book=deps.node_book)}),
        leases=Indexer({"heartbeats": partial(cache.lease_record, book=deps.beat_book)}),
    )


def cached_view(
    deps: Deps,
    own: OwnIndexes,
    jobs: Index,
    workloads: Index | None = None,
    flavors: Index | None = None,
) -> cache.CachedView:
    """The reconciles' view: `jobs` (and Kueue's objects) from kopf's indexes, the rest ours."""
    return cache.CachedView(
        jobs=jobs,
        pods=own.pods.indexes["pods"],
        pools=own.pods.indexes["pools"],
        node_pods=own.pods.indexes["node_pods"],
        nodes=own.nodes.indexes["nodes"],
        heartbeats=own.leases.indexes["heartbeats"],
        node_book=deps.node_book,
        workloads=workloads,
        flavors=flavors,
    )


def _scoped(
    kind: str,
    what: str,
    namespaces: tuple[str, ...],
    everywhere: Callable[..., Any],
    one: Callable[..., Any],
) -> list[Watched]:
    """One stream per watched namespace when they are plain names, else one of the whole
    cluster, filtered by the patterns (which then needs the right to list in every one)."""
    if namespaces and namespace_filter(namespaces) is None:
        return [
            Watched(f"{what} in {ns}", partial(one, ns), labels.JOB, namespace=ns, kind=kind)
            for ns in namespaces
        ]
    accept = namespace_filter(namespaces) if namespaces else None
    if accept is None:
        return [Watched(what, everywhere, labels.JOB, kind=kind)]
    return [Watched(what, everywhere, labels.JOB, accept=accept, kind=kind)]


def informers(
    deps: Deps,
    own: OwnIndexes,
    api: client.ApiClient,
    namespaces: tuple[str, ...],
    loop: asyncio.AbstractEventLoop,
) -> list[Informer]:
    core, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)
    nodes = Watched("nodes", core.list_node, kind=Stream.NODES)
    made = [Informer(nodes, own.nodes, partial(node_changed, deps), loop, deps.clock)]
    for watched in _scoped(
        Stream.PODS, "pods", namespaces, core.list_pod_for_all_namespaces, core.list_namespaced_pod
    ):
        made.append(Informer(watched, own.pods, partial(pod_changed, deps), loop, deps.clock))
    for watched in _scoped(
        Stream.LEASES,
        "heartbeat Leases",
        namespaces,
        leases.list_lease_for_all_namespaces,
        leases.list_namespaced_lease,
    ):
        made.append(Informer(watched, own.leases, partial(lease_changed, deps), loop, deps.clock))
    return made


async def start(deps: Deps, running: Iterable[Informer]) -> None:
    """Start the informers and return once each has its first listing in the indexes."""
    started = list(running)
    for informer in started:
        informer.start()
    deps.informers.extend(started)
    await asyncio.gather(*(informer.synced.wait() for informer in started))


def stop(deps: Deps) -> None:
    for informer in deps.informers:
        informer.stop()
    deps.informers.clear()


def _meta(change: Change) -> tuple[str, str, dict[str, Any]]:
    meta = change.body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or ""), meta.get("labels") or {}


def pod_changed(deps: Deps, change: Change) -> None:
    namespace, _, found = _meta(change)
    job = found.get(labels.JOB)
    if not job:
        return
    now = time.monotonic()
    deps.wakes.wake((namespace, str(job)), at=now)
    # A pod that ended or went may free its pool for a job waiting for that shape.
    spec, status = change.body.get("spec") or {}, change.body.get("status") or {}
    selector = spec.get("nodeSelector") or {}
    pool = selector.get(labels.NODEPOOL)
    ended = change.type == DELETED or status.get("phase") in ("Succeeded", "Failed")
    if (
        ended
        and pool
        and deps.view is not None
        and not deps.view.pool_holders(pool)
        and deps.pools.holder(pool) is None
    ):
        shape = (selector.get(labels.ACCELERATOR), selector.get(labels.TOPOLOGY))
        if shape[0] and shape[1]:
            deps.wakes.pool_freed((str(shape[0]), str(shape[1])), at=now)


def lease_changed(deps: Deps, change: Change) -> None:
    namespace, name, found = _meta(change)
    job = found.get(labels.JOB)
    if not job or deps.view is None:
        return
    key = (namespace, str(job))
    # Parsed once, by the index (which took the change in before this runs).
    beat = deps.view.heartbeat(namespace, name)
    if beat is not None and deps.wakes.heartbeat(key, beat, now=deps.clock()):
        deps.wakes.wake(key, at=time.monotonic())


def node_changed(deps: Deps, change: Change) -> None:
    """Wake the jobs with pods on this node or a placement on its pool, and the job that
    marked it bad; a healthy node of a pool nobody holds may also let a waiting job in.
    A status renewal that changed nothing the planner reads wakes no one."""
    _, name, _ = _meta(change)
    if deps.view is None or not name:
        return
    if change.type == DELETED:
        deps.node_book.note(name, None)
    if not deps.node_book.take_change(name):
        return
    now = time.monotonic()
    view = deps.view.node(name)  # parsed once, by the index; None once deleted
    deps.tpu_short_since = note_tpu_shortfall(deps.tpu_short_since, name, view, now=deps.clock())
    concerned = set(deps.view.jobs_on_node(name))
    holder = deps.pools.holder(view.pool or "") if view is not None else None
    if holder is not None:
        concerned.add(holder)
    deps.wakes.wake_live(concerned, at=now)
    marker = marked_by(view.mark_reason) if view is not None and not down_now(view) else None
    if marker is not None:
        # The job that marked a node lost may take its mark off once the node is back,
        # finished or not: only it knows why, and nothing else would wake a finished job.
        deps.wakes.wake(marker, at=now)
    if (
        view is not None
        and view.pool
        and holder is None
        and view.accelerator
        and view.topology
        and placeable(view)
        and not deps.view.pool_holders(view.pool)
    ):
        deps.wakes.pool_freed((view.accelerator, view.topology), at=now)
