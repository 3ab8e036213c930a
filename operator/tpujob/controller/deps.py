"""What the operator's handlers share (kopf's memo): clients, cache, settings, bookkeeping.

Everything here lives for the operator process and is rebuilt after a restart from the
cluster (the watch-fed cache, the jobs' recorded placements); nothing in it is a source of
truth that a crash could lose.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

from tpujob.api import Phase, TPUTrainingJob, TPUTrainingJobStatus, parse_job, status_patch
from tpujob.controller.metrics import Metrics
from tpujob.controller.wakeups import JobKey, WakeBook
from tpujob.diagnosis.memory import NodeLedger
from tpujob.diagnosis.site import SiteRule
from tpujob.gcp.client import CatalogueSource
from tpujob.kube.apply import Writer
from tpujob.kube.cache import BeatBook, CachedView, NodeBook
from tpujob.kube.informer import Informer
from tpujob.kube.observe import Reader
from tpujob.kube.workloads import WorkloadWriter
from tpujob.plan.manifests import heartbeat_lease_name
from tpujob.plan.result import PlannerSettings

API_THREADS = 16
# Reconciles in progress at once. A thousand jobs created together wake a thousand daemons;
# each reconcile holds its job's body, parsed models, plan and manifests until it ends, so
# unbounded they hold all of that at once (the operator's peak memory) while the API threads
# can serve only API_THREADS calls anyway. The others wait their turn holding nothing.
RECONCILE_SLOTS = 2 * API_THREADS
# Objects this operator created are not created again for this long: the watch may not have
# shown them yet, and a create of what exists is a wasted request answered 409.
RECENT_WRITE_SECONDS = 30.0
# kopf's own connections (watch streams, finalizers, its Events) beyond one per watch stream:
# requests beyond them wait for a free connection instead of opening one (see
# `kopf_connection_limit`).
KOPF_REQUEST_CONNECTIONS = 32
# kopf's watch streams per watched scope (jobs; Kueue's Workloads and flavors: pods, Leases and
# nodes have watches of their own, `tpujob.controller.watches`, with a margin), and those kopf
# may hold of its own (CRDs, namespaces, peering), with a margin.
WATCHES_PER_SCOPE = 4
KOPF_OWN_WATCHES = 4
T = TypeVar("T")
_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def kopf_connection_limit(namespaces: tuple[str, ...]) -> int:
    """The most connections kopf's session may open (0: no limit).

    kopf opens a connection for every request that finds none free, without limit, and each
    TLS connection holds a 256 KiB read buffer of asyncio's: a thousand jobs created together
    had kopf add its finalizer to each at once over a thousand connections, 250 MiB and most
    of the operator's peak memory. A limit must leave every watch stream its connection, or
    a stream not yet opened would wait behind requests that wait for it: with anything but
    plain namespace names (kopf also takes globs, `!` exclusions and comma-separated lists)
    the number of watched namespaces is not known in advance, so there is none.
    """
    if not all(_NAMESPACE_NAME.fullmatch(ns) for ns in namespaces):
        return 0
    return WATCHES_PER_SCOPE * max(1, len(namespaces)) + KOPF_OWN_WATCHES + KOPF_REQUEST_CONNECTIONS


@dataclass(frozen=True)
class LeaseAccess:
    """Watching every namespace, the operator writes Leases only where it bound `role` to its
    own ServiceAccount, which it does in a namespace when it first launches a job there."""

    role: str
    account: str
    account_namespace: str
    binding: str = "tpujob-operator-leases"


class RecentWrites:
    """What this process created or fenced lately (thread-safe: effects run in threads)."""

    def __init__(
        self, ttl_seconds: float = RECENT_WRITE_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl, self._clock = ttl_seconds, clock
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def fresh(self, what: str) -> bool:
        with self._lock:
            at = self._seen.get(what)
            return at is not None and self._clock() - at < self._ttl

    def note(self, what: str) -> None:
        with self._lock:
            now = self._clock()
            self._seen[what] = now
            if len(self._seen) > 4096:
                self._seen = {k: t for k, t in self._seen.items() if now - t < self._ttl}


class Stream(StrEnum):
    """The operator's own watches (`Watched.kind` of each informer)."""

    PODS = "pods"
    NODES = "nodes"
    LEASES = "leases"


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class JobBook:
    """What the operator remembers of each live job between its reconciles; `forget` drops
    all of it at once, so a job that goes leaves nothing behind."""

    # The body each job's last status write returned: newer than the cache until the watch
    # delivers it, so the next reconcile does not plan on the status it just replaced.
    written: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    progress_written: dict[JobKey, dt.datetime] = field(default_factory=dict)
    # Each live job as last parsed, by (uid, resourceVersion): a job reconciled again
    # unchanged (polled while it waits for a pool or runs between events) is not validated
    # again. Dropped when the job finishes or goes.
    parsed: dict[JobKey, tuple[tuple[str, str], TPUTrainingJob]] = field(default_factory=dict)
    # New jobs whose first reconcile waits for kopf's finalizer. A status written before that
    # patch lands carries the older resourceVersion and is refused: in a burst of new jobs
    # nearly every first reconcile planned, took a pool and then met a Conflict, and went to
    # the back of the queue. Woken when the finalizer shows.
    awaiting_finalizer: set[JobKey] = field(default_factory=set)
    # Each job's parsed status (the one in `parsed`) and its dump: the status a reconcile
    # compares its plan's with is most often the one the last reconcile dumped.
    dumped: dict[JobKey, tuple[TPUTrainingJobStatus, dict[str, Any]]] = field(default_factory=dict)

    def dump(self, key: JobKey, status: TPUTrainingJobStatus) -> dict[str, Any]:
        """`status_patch(status)`, kept while `status` is the job's last parsed status."""
        held = self.dumped.get(key)
        if held is not None and held[0] is status:
            return held[1]
        dumped = status_patch(status)
        self.dumped[key] = (status, dumped)
        return dumped

    def parse(self, key: JobKey, body: Mapping[str, Any]) -> TPUTrainingJob:
        """`parse_job(body)`, reusing the last parse of `key` when the body is the same
        version of the same job (a resourceVersion names one content of one object)."""
        meta = body.get("metadata") or {}
        version = (str(meta.get("uid") or ""), str(meta.get("resourceVersion") or ""))
        held = self.parsed.get(key)
        if held is not None and all(version) and held[0] == version:
            return held[1]
        job = parse_job(body)
        self.parsed[key] = (version, job)
        return job

    def forget_parse(self, key: JobKey) -> None:
        """Drop the job's parse and its status's dump (a finished job is rarely reconciled
        again: not worth their memory)."""
        self.parsed.pop(key, None)
        self.dumped.pop(key, None)

    def forget(self, key: JobKey) -> None:
        self.written.pop(key, None)
        self.progress_written.pop(key, None)
        self.forget_parse(key)
        self.awaiting_finalizer.discard(key)


@dataclass
class PoolClaims:
    """The placement authority: pool -> the job that holds it (for a slice, or as a spare).

    Taken under `lock` in the same step as the plan that chose it, so two jobs planned at once
    never pick one pool. Rebuilt after a restart from each job's recorded placement (and,
    meanwhile, the pods that exist mark their pools busy).
    """

    holders: dict[str, JobKey] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The other way round, so that a reconcile's claim costs the job's pools, not the cluster's.
    held: dict[JobKey, set[str]] = field(default_factory=dict)

    def assign(self, pool: str, key: JobKey) -> bool:
        """Give `pool` to `key` unless another job holds it; whether `key` holds it now."""
        owner = self.holders.setdefault(pool, key)
        if owner == key:
            self.held.setdefault(key, set()).add(pool)
        return owner == key

    def claim(self, key: JobKey, status: TPUTrainingJobStatus | None) -> list[str]:
        """Record the pools `key`'s status holds (none once it finished or is gone); returns
        the pools it let go of."""
        before = self.held.pop(key, set())
        for pool in before:
            if self.holders.get(pool) == key:
                del self.holders[pool]
        if status is not None and status.phase not in (Phase.SUCCEEDED, Phase.FAILED):
            for slot in status.current_attempt.placement:
                self.assign(slot.node_pool, key)
            for spare in status.spares:  # a warm spare is held as a placed pool is
                self.assign(spare.node_pool, key)
        return sorted(p for p in before if self.holders.get(p) is None)

    def holder(self, pool: str) -> JobKey | None:
        return self.holders.get(pool)

    def claimed_by_others(self, key: JobKey) -> frozenset[str]:
        # Set operations, not a walk of every claim in Python: asked at every reconcile.
        return frozenset(self.holders).difference(self.held.get(key, ()))


@dataclass
class ApiHealth:
    """Whether the API server answers, as the operator last found it.

    `reachable_since`: since when it has answered without a break (None: not known yet, and
    a heartbeat's age counts in full). `down` is set when a call finds it unreachable; the
    next reconcile asks the API before planning (one at a time, under `probe_lock`), and only
    its answer ends the outage.
    """

    reachable_since: dt.datetime | None = None
    down: bool = False
    probe_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class Deps:
    """What the handlers share (kopf's memo); copying returns the same object."""

    reader: Reader
    writer: Writer
    metrics: Metrics = field(default_factory=Metrics)
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    clock: Callable[[], dt.datetime] = utc_now
    # The watch-fed cache, the only source of a reconcile's reads of the cluster (`reader`
    # answers what no watch keeps). Attached by a start-up handler, since kopf hands out its
    # indexes only to handlers; kopf spawns no daemon before its start-up handlers ran.
    view: CachedView | None = None
    wakes: WakeBook = field(default_factory=WakeBook)
    jobs: JobBook = field(default_factory=JobBook)
    pools: PoolClaims = field(default_factory=PoolClaims)
    api: ApiHealth = field(default_factory=ApiHealth)
    # The finalizer kopf adds to a new job in the same step that starts its daemon (None: no
    # kopf, no wait): a new job's first reconcile waits for it (`JobBook.awaiting_finalizer`).
    finalizer: str | None = None
    # Since when each node's allocatable TPUs have been below capacity: the Node object keeps
    # no such time, so the operator remembers it (a restart only restarts the grace).
    # Kept by the node event handler (the watch shows every change), replaced, never changed,
    # since plans read it in worker threads.
    tpu_short_since: Mapping[str, dt.datetime] = field(default_factory=dict)
    # The nodes the planner reads, fed by the node index; which changed, for the handler.
    node_book: NodeBook = field(default_factory=lambda: NodeBook(clock=utc_now))
    # When each heartbeat renewal was first seen, by this operator's clock (the Lease index).
    beat_book: BeatBook = field(default_factory=BeatBook)
    # Blocking client calls and planning run here, not in the loop's default executor (six
    # threads on a small pod, shared with kopf): sized for many jobs reconciling at once.
    executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(
            max_workers=API_THREADS, thread_name_prefix="tpujob"
        )
    )
    # Longest a plan (diagnosis included) may take; user rules are linear-time, so this is a
    # guard against the unforeseen, and the loop stays free meanwhile.
    plan_budget_seconds: float = 10.0
    # The optional Cloud TPU zone catalogue (advice only); refreshed by `refresh_catalogue`.
    catalogue: CatalogueSource | None = None
    catalogue_refresh_seconds: float = 6 * 3600.0
    background: list[asyncio.Task[None]] = field(default_factory=list)  # kept, not collected
    log_tails: OrderedDict[str, str] = field(default_factory=OrderedDict)
    recent: RecentWrites = field(default_factory=RecentWrites)
    # The node ledger (soft blames of nodes across jobs), kept in a ConfigMap of the
    # operator's own namespace so that it survives a restart; in memory only without one.
    ledger: NodeLedger = field(default_factory=NodeLedger)
    ledger_namespace: str | None = None
    # The cluster's site rules, read from a ConfigMap beside the ledger (`sweeps.read_site_rules`).
    site_rules: tuple[SiteRule, ...] = ()
    ledger_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reconcile_slots: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(RECONCILE_SLOTS)
    )
    lease_access: LeaseAccess | None = None
    # Writes to jobs' Kueue Workloads; None: the operator runs without its Kueue integration.
    workloads: WorkloadWriter | None = None
    # How often the cache is checked for ghosts (`sweeps.check_for_ghosts`); 0: never.
    cache_check_seconds: float = 300.0
    kopf_connections: int = 0  # kopf_connection_limit(); 0: kopf's own unlimited session
    # The client of the operator's own watches (`tpujob.controller.watches`), the namespaces
    # they watch (none: all), and the informers running. No client: no watches (the cache is
    # filled by whoever made these Deps, as tests do).
    watch_api: Any = None
    namespaces: tuple[str, ...] = ()
    informers: list[Informer] = field(default_factory=list)

    def __copy__(self) -> Deps:
        return self

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking call in the operator's executor."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def heartbeats_seen_since(self, now: dt.datetime) -> dt.datetime | None:
        """Since when the operator could have seen every heartbeat renewal: the API answered
        and each heartbeat Lease stream ran, without a break (None: no break known, and a
        heartbeat's age counts in full). While a stream is broken, `now`: no clock judged on
        heartbeats runs while the renewals could not be seen (an informer's retry after an
        outage may come well after the API answers again).
        """
        since = self.api.reachable_since
        for informer in self.informers:
            if informer.watched.kind != Stream.LEASES:
                continue
            if informer.broken:
                return now
            resumed = informer.resumed_at
            if resumed is not None and (since is None or resumed > since):
                since = resumed
        return since

    def forget(self, key: JobKey) -> None:
        """Drop everything kept of a job that is gone: its book, wakes, metrics and pools."""
        self.wakes.forget(key)
        self.jobs.forget(key)
        self.beat_book.forget((key[0], heartbeat_lease_name(key[1])))
        self.metrics.forget_job(*key)
        self.pools.claim(key, None)
