"""The operator's view of the cluster, kept by the watches it already runs.

Each `*_record` function turns one watched object into the small, parsed value an index keeps:
the jobs' through kopf's index (kopf calls it on every watch event of a job), the pods', nodes'
and Leases' through the operator's own informers (`tpujob.kube.informer`, wired in
`tpujob.controller.watches`). Either drops a deleted object's values itself, and no reconcile
starts before every index has been filled by its first listing, so a reconcile never sees a
half-listed cluster. `CachedView` answers a
reconcile's reads from those indexes: no LIST and no GET per reconcile, and parsing (pods,
nodes, heartbeats) happens once per change instead of once per reconcile of every job.

An index is any mapping from a key to the values stored under it (kopf's `Index` and
`tpujob.kube.indexes.Index` are), so this module needs no kopf and is tested with plain dicts.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, cast

from tpujob.api import KIND, labels
from tpujob.kube.ghosts import Ghosts
from tpujob.observed.redact import redact
from tpujob.observed.views import Heartbeat, NodeView, PodView, heartbeat_view, node_view, pod_view
from tpujob.plan.manifests import heartbeat_lease_name

Index = Mapping[Hashable, Iterable[Any]]
JobKey = tuple[str, str]


@dataclass(frozen=True)
class PodRecord:
    """A pod that claims (by label) to belong to a job, parsed and redacted once."""

    owners: frozenset[str]  # ownerReference uids: only the job whose uid is here owns it
    view: PodView


def job_key(namespace: str | None, job: str | None) -> JobKey | None:
    return (namespace, job) if namespace and job else None


def pod_record(raw: Mapping[str, Any]) -> PodRecord:
    """Termination messages end up in the status and Events: redacted here, once."""
    refs = (raw.get("metadata") or {}).get("ownerReferences") or []
    owners = frozenset(str(r.get("uid")) for r in refs if isinstance(r, Mapping) and r.get("uid"))
    view = pod_view(raw)
    return PodRecord(owners=owners, view=replace(view, message=redact(view.message)))


def pod_by_job(raw: Mapping[str, Any]) -> dict[Hashable, PodRecord]:
    meta = raw.get("metadata") or {}
    key = job_key(meta.get("namespace"), (meta.get("labels") or {}).get(labels.JOB))
    return {key: pod_record(raw)} if key else {}


def asks_for_tpus(spec: Mapping[str, Any]) -> bool:
    """Some container of the pod asks for google.com/tpu (an extended resource: its limit and
    request are equal, either may be written)."""
    for container in spec.get("containers") or ():
        if not isinstance(container, Mapping):
            continue
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            amount = (resources.get(kind) or {}).get(labels.TPU_RESOURCE)
            if str(amount or "0").strip() not in ("", "0"):
                return True
    return False


def pod_by_pool(raw: Mapping[str, Any]) -> dict[Hashable, JobKey]:
    """Pools that live pods of a job hold: pods that ended hold no chips, and neither does a
    pod that asks for none. A label is free to write, so a pod that names a job and a pool
    but asks for no TPU would otherwise hold a pool at no cost to its tenant; one that asks
    for chips holds them for real, within its tenant's quota."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    key = job_key(meta.get("namespace"), (meta.get("labels") or {}).get(labels.JOB))
    pool = (spec.get("nodeSelector") or {}).get(labels.NODEPOOL)
    phase = (raw.get("status") or {}).get("phase")
    if key is None or not pool or phase in ("Succeeded", "Failed") or not asks_for_tpus(spec):
        return {}
    return {str(pool): key}


def pod_by_node(raw: Mapping[str, Any]) -> dict[Hashable, JobKey]:
    """The node a job's pod is bound to: a change to that node concerns the job."""
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    key = job_key(meta.get("namespace"), (meta.get("labels") or {}).get(labels.JOB))
    node = spec.get("nodeName")
    return {str(node): key} if key and node else {}


def node_record(raw: Mapping[str, Any], book: NodeBook) -> dict[Hashable, NodeView]:
    """The node's view for the index, noted in `book` (which the reconciles read)."""
    view = node_view(raw)
    book.note(view.name, view)
    return {view.name: view}


class NodeBook:
    """The nodes as the planner reads them, and which of them changed in a way it sees.

    Kubelets renew their node's status every few seconds without changing anything the
    planner reads (`NodeView` holds no heartbeat times). Such an event costs one comparison
    here: no new snapshot for the reconciles, no wake of the jobs on that node. The snapshot
    handed to a reconcile is never changed afterwards (planning reads it in a worker thread);
    a change makes the next `snapshot()` a new one. Fed by the node index, which the node
    informer runs in its own thread, and read by the node event handler and the reconciles
    in the event loop: every method holds the book's lock, so a snapshot taken while a node is
    noted is never kept in place of the newer one.

    With a `clock`, the book times the Ready transitions it witnesses by it. The kubelet
    writes the transition time of the Ready it posts (True, False) by the node's clock, and a
    node clock 60 s slow would make a 2 s kubelet restart look 62 s old, past the grace: a
    transition this operator saw happen is timed by its own clock, and that time holds until
    the next one. Unknown is posted by the control plane's node controller, by its clock, and
    is kept; so is any state first seen (after a restart of the operator it is all there is).
    """

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._views: dict[str, NodeView] = {}
        self._snapshot: Mapping[str, NodeView] | None = None
        self._changed: set[str] = set()
        self._clock = clock
        self._lock = threading.Lock()

    def _witnessed(self, before: NodeView, view: NodeView) -> NodeView:
        if view.ready == before.ready:
            since = before.ready_since  # as first timed, until the next transition
        elif view.ready in ("True", "False") and self._clock is not None:
            since = self._clock()
        else:
            return view
        return view if view.ready_since == since else replace(view, ready_since=since)

    def note(self, name: str, view: NodeView | None) -> None:
        """What a watch event showed of node `name` (None: deleted)."""
        with self._lock:
            before = self._views.get(name)
            if view is not None and before is not None and self._clock is not None:
                view = self._witnessed(before, view)
            if before == view:
                return
            if view is None:
                del self._views[name]
            else:
                self._views[name] = view
            self._snapshot = None
            self._changed.add(name)

    def take_change(self, name: str) -> bool:
        """Whether `name` changed since the last call for it."""
        with self._lock:
            changed = name in self._changed
            self._changed.discard(name)
            return changed

    def snapshot(self) -> Mapping[str, NodeView]:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = MappingProxyType(dict(self._views))
            return self._snapshot


class BeatBook:
    """When this operator first saw each heartbeat Lease's current renewal, by its own clock.

    The watch shows a Lease again for reasons that are no renewal (a relist, a patch of its
    fencing token): a renewal is a new `renewTime`, stamped once. Fed by the Lease index (in
    the thread of the informer of the Lease's namespace, one event at a time, so a Lease is
    never witnessed twice at once); a job's entry goes with the job (`forget`).
    """

    def __init__(self, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self._clock = clock
        self._seen: dict[Hashable, tuple[datetime | None, datetime]] = {}

    def witness(self, key: Hashable, renewed: datetime | None) -> datetime:
        found = self._seen.get(key)
        if found is not None and found[0] == renewed:
            return found[1]
        now = self._clock()
        self._seen[key] = (renewed, now)
        return now

    def forget(self, key: Hashable) -> None:
        self._seen.pop(key, None)


def lease_record(raw: Mapping[str, Any], book: BeatBook | None = None) -> dict[Hashable, Heartbeat]:
    """A job's heartbeat Lease: one that a job owns under the name the operator gives it.

    The label the watch selects by is free to write, and a Lease may carry 256 KiB of
    annotations: without the owner, a tenant's labelled Leases would be cached without bound.
    An owner reference that names no existing job is removed by the garbage collector, and
    the name is the owner's own, so a job has one such Lease at most.
    """
    meta = raw.get("metadata") or {}
    name = meta.get("name")
    refs = meta.get("ownerReferences") or ()
    if not any(
        isinstance(r, Mapping)
        and r.get("kind") == KIND
        and name == heartbeat_lease_name(str(r.get("name")))
        for r in refs
    ):
        return {}
    view = heartbeat_view(raw)
    if view is None:
        return {}
    key = (str(meta.get("namespace")), str(name))
    if book is not None:
        view = replace(view, seen=book.witness(key, view.renewed))
    return {key: view}


def job_record(raw: Mapping[str, Any]) -> dict[Hashable, dict[str, Any]]:
    """The job as last seen: a deep copy, since the watch's own object keeps changing, of all
    but `metadata.managedFields` (the apiserver's bookkeeping of who wrote which field, which
    grows with every status write and which nothing here reads).

    The record is read-only from then on: a later event replaces it, never changes it, so
    reconciles share it instead of copying it again each time.
    """
    meta = dict(raw.get("metadata") or {})
    meta.pop("managedFields", None)
    key = (str(meta.get("namespace")), str(meta.get("name")))
    return {key: copy.deepcopy({**raw, "metadata": meta})}


def newer(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The later of two versions of one object.

    resourceVersions are opaque by contract, but every apiserver backed by etcd hands out
    increasing integers; when both are integers the larger wins, otherwise `a` (the watch's)
    does, which at worst costs one Conflict and a redo.
    """
    if a is None or b is None:
        return a if b is None else b
    va = str((a.get("metadata") or {}).get("resourceVersion", ""))
    vb = str((b.get("metadata") or {}).get("resourceVersion", ""))
    if va.isdigit() and vb.isdigit() and int(vb) > int(va):
        return b
    return a


def _one(index: Index, key: Hashable) -> Any:
    return next(iter(index.get(key, ())), None)


@dataclass(frozen=True)
class CachedUids:
    """The uids the cache holds, by kind, and the namespaces its pods and jobs are in."""

    pods: frozenset[str]
    nodes: frozenset[str]
    jobs: frozenset[str]
    pod_namespaces: frozenset[str]
    job_namespaces: frozenset[str]


def _uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid") or "")


@dataclass(frozen=True)
class CachedView:
    """One reconcile's reads, answered from the watch-fed indexes (in the event loop only:
    the indexes change there), less the ghosts (`tpujob.kube.ghosts`): entries of
    objects the cluster no longer has, whose deletion a broken watch missed."""

    jobs: Index
    pods: Index
    pools: Index
    nodes: Index
    heartbeats: Index
    node_pods: Index = field(default_factory=dict)
    # Fed by the node index: reconciles read its snapshot instead of walking the index.
    node_book: NodeBook = field(default_factory=NodeBook)
    # Noted by the operator's cache check (`tpujob.controller.sweeps.find_ghosts`); empty but
    # after a broken watch, so the reads below pay for the filtering only then.
    ghosts: Ghosts = field(default_factory=Ghosts)
    # Kueue's Workloads of jobs and its ResourceFlavors (`tpujob.kube.workloads`); None when
    # the operator runs without its Kueue integration.
    workloads: Index | None = None
    flavors: Index | None = None

    def job_body(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job's record, shared: read it, never change it (see `job_record`)."""
        found: dict[str, Any] | None = _one(self.jobs, (namespace, name))
        gone = self.ghosts.jobs.ghosts
        return None if found is not None and gone and _uid(found) in gone else found

    def pod_records(self, namespace: str, job: str) -> list[PodRecord]:
        records = list(self.pods.get((namespace, job), ()))
        gone = self.ghosts.pods.ghosts
        return [r for r in records if r.view.uid not in gone] if gone else records

    def node_views(self) -> Mapping[str, NodeView]:
        gone = self.ghosts.nodes.ghosts
        nodes = self.node_book.snapshot()
        if not gone:
            return nodes
        return MappingProxyType({name: v for name, v in nodes.items() if v.uid not in gone})

    def node(self, name: str) -> NodeView | None:
        found: NodeView | None = _one(self.nodes, name)
        return None if found is not None and found.uid in self.ghosts.nodes.ghosts else found

    def heartbeat(self, namespace: str, lease: str) -> Heartbeat | None:
        found: Heartbeat | None = _one(self.heartbeats, (namespace, lease))
        return found

    def _held(self, pool: Hashable) -> frozenset[JobKey]:
        """The jobs holding `pool`: a holder whose every pod there is a ghost holds nothing."""
        holders = frozenset(self.pools.get(pool, ()))
        gone = self.ghosts.pods.ghosts
        if not gone:
            return holders
        return frozenset(
            key
            for key in holders
            if any(
                r.view.node_pool == pool and r.view.uid not in gone for r in self.pods.get(key, ())
            )
        )

    def busy_pools(self, namespace: str, job: str) -> frozenset[str]:
        """Pools where live pods of other jobs hold chips: every held pool but those held by
        this job alone, which can only be pools its own pods ask for (so a thousand held
        pools cost a set, not a look at each one's holders)."""
        me = (namespace, job)
        if self.ghosts.pods.ghosts:
            return frozenset(str(p) for p in self.pools if self._held(p) - {me})
        mine = {r.view.node_pool for r in self.pods.get(me, ()) if r.view.node_pool}
        alone = {pool for pool in mine if all(holder == me for holder in self.pools.get(pool, ()))}
        # The keys are pool names (`pod_by_pool`); set operations, not a loop: every reconcile.
        return cast(frozenset[str], frozenset(self.pools)).difference(alone)

    def pool_holders(self, pool: str) -> frozenset[JobKey]:
        return self._held(pool)

    def jobs_on_node(self, node: str) -> frozenset[JobKey]:
        return frozenset(self.node_pods.get(node, ()))

    def cached_uids(self) -> CachedUids:
        """What the cache holds, for the ghost check (a walk of every index: seldom)."""
        pods = [(key, r) for key, records in self.pods.items() for r in records]
        bodies = [b for found in self.jobs.values() for b in found]
        return CachedUids(
            pods=frozenset(r.view.uid for _, r in pods),
            nodes=frozenset(v.uid for v in self.node_book.snapshot().values()),
            jobs=frozenset(_uid(b) for b in bodies),
            pod_namespaces=frozenset(str(key[0]) for key, _ in pods if isinstance(key, tuple)),
            job_namespaces=frozenset(
                str((b.get("metadata") or {}).get("namespace") or "") for b in bodies
            ),
        )

    def jobs_with_ghosts(self) -> frozenset[JobKey]:
        """The jobs a ghost concerns: its pod, a node its pods are on, the job itself."""
        pods, nodes, jobs = (
            self.ghosts.pods.ghosts,
            self.ghosts.nodes.ghosts,
            self.ghosts.jobs.ghosts,
        )
        found: set[JobKey] = set()
        if pods:
            found.update(
                key
                for key, records in self.pods.items()
                if isinstance(key, tuple) and any(r.view.uid in pods for r in records)
            )
        for view in self.node_book.snapshot().values() if nodes else ():
            if view.uid in nodes:
                found.update(self.jobs_on_node(view.name))
        if jobs:
            found.update(
                key
                for key, bodies in self.jobs.items()
                if isinstance(key, tuple) and any(_uid(b) in jobs for b in bodies)
            )
        return frozenset(found)
