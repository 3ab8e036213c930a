"""Prometheus metrics of the operator, on a registry of its own, with `record_*` helpers.

No logic: the controller calls these after a status write succeeded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from tpujob.api import GoodputBreakdown, Phase

RECOVERY_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.jobs = Gauge("tpujob_jobs", "Jobs by phase.", ["phase"], registry=r)
        self.failures = Counter(
            "tpujob_failures",
            "Diagnosed failures by class and code.",
            ["class", "code"],
            registry=r,
        )
        self.restarts = Counter(
            "tpujob_restarts", "Restarts by failure class.", ["class"], registry=r
        )
        self.recovery = Histogram(
            "tpujob_recovery_duration_seconds",
            "From a failure seen to training resumed.",
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.goodput = Gauge(
            "tpujob_goodput_ratio",
            "Productive training time over wall time.",
            ["namespace", "job"],
            registry=r,
        )
        self.goodput_seconds = Gauge(
            "tpujob_goodput_seconds",
            "Job wall time by goodput category (seconds).",
            ["namespace", "job", "category"],
            registry=r,
        )
        self.budget_left = Gauge(
            "tpujob_failed_node_budget_remaining",
            "Nodes that may still fail before the job fails.",
            ["namespace", "job"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "tpujob_reconcile_duration_seconds",
            "One reconcile of one job, reads to Events.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.wake_seconds = Histogram(
            "tpujob_wake_to_start_seconds",
            "From an event waking a job to its reconcile starting.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.api_requests = Counter(
            "tpujob_api_requests",
            "Requests the operator's client sent, by HTTP verb.",
            ["verb"],
            registry=r,
        )
        # process_cpu_seconds_total, process_resident_memory_bytes, open fds (Linux).
        ProcessCollector(registry=r)
        self._phases: dict[tuple[str, str], str] = {}
        # What each job's series were last set to: a reconcile that changed nothing of them
        # (most do) sets none, sparing a label lookup per series.
        self._shown: dict[tuple[str, str], tuple[float | None, int | None]] = {}
        self._breakdowns: dict[tuple[str, str], GoodputBreakdown] = {}
        for p in Phase:  # every phase is a series from the start, 0 until a job has it
            self.jobs.labels(phase=str(p)).set(0)
        # Every category `record_breakdown` may be given, so that a job's series all go with it.
        self._categories = tuple(
            GoodputBreakdown(wall_seconds=0).model_dump(by_alias=True, exclude={"wall_seconds"})
        )

    def record_job(
        self,
        namespace: str,
        job: str,
        phase: Phase | None,
        goodput: float | None,
        budget_left: int | None,
    ) -> None:
        now, before = str(phase or Phase.PENDING), self._phases.get((namespace, job))
        if now != before:  # counts kept as jobs move, not recounted over every job
            self._phases[(namespace, job)] = now
            self.jobs.labels(phase=now).inc()
            if before is not None:
                self.jobs.labels(phase=before).dec()
        if self._shown.get((namespace, job)) == (goodput, budget_left):
            return
        self._shown[(namespace, job)] = (goodput, budget_left)
        if goodput is not None:
            self.goodput.labels(namespace=namespace, job=job).set(goodput)
        if budget_left is not None:
            self.budget_left.labels(namespace=namespace, job=job).set(budget_left)

    def record_breakdown(
        self, namespace: str, job: str, breakdown: GoodputBreakdown, *, written: bool = True
    ) -> None:
        """Show the job's breakdown as its status shows it: set when a status with it was
        `written` (between writes it moves with the clock alone, at every reconcile), or when
        the job has no series yet (an operator that just started)."""
        shown = self._breakdowns.get((namespace, job))
        if shown is not None and (not written or shown == breakdown):
            return
        self._breakdowns[(namespace, job)] = breakdown
        parts = breakdown.model_dump(by_alias=True, exclude={"wall_seconds"})
        for category, seconds in parts.items():
            self.goodput_seconds.labels(namespace=namespace, job=job, category=category).set(
                seconds
            )

    def forget_job(self, namespace: str, job: str) -> None:
        before = self._phases.pop((namespace, job), None)
        self._shown.pop((namespace, job), None)
        self._breakdowns.pop((namespace, job), None)
        if before is not None:
            self.jobs.labels(phase=before).dec()
        for category in list(self._categories):
            with contextlib.suppress(KeyError):
                self.goodput_seconds.remove(namespace, job, category)
        for gauge in (self.goodput, self.budget_left):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, job)

    def record_failure(self, failure_class: str, code: str, restarted: bool) -> None:
        self.failures.labels(**{"class": failure_class, "code": code}).inc()
        if restarted:
            self.restarts.labels(**{"class": failure_class}).inc()

    def record_request(self, verb: str) -> None:
        self.api_requests.labels(verb=verb.upper()).inc()

    def record_recovery(self, seconds: float) -> None:
        self.recovery.observe(seconds)


def reference() -> list[tuple[str, str, tuple[str, ...], str]]:
    """(name as scraped, type, labels, help) of every tpujob metric, for the generated page
    (a histogram's name is the stem of its _bucket, _sum and _count series).

    Read from the client's own objects, so the page cannot name a metric that is not there."""
    rows = []
    for metric in vars(Metrics()).values():
        if isinstance(metric, (Counter, Gauge, Histogram)):
            kind, name = str(metric._type), str(metric._name)
            shown = f"{name}_total" if kind == "counter" else name
            labels = tuple(str(n) for n in metric._labelnames)
            rows.append((shown, kind, labels, str(metric._documentation)))
    return sorted(rows)
