"""Training health: the trainer's health numbers read, range-checked and judged.

Pure: no I/O, no clock (time comes in as seconds). Worker 0 publishes the job's health
numbers as annotations on the heartbeat Lease (`tpujob.api.contract`); `parse_health` reads them,
`assess` turns one report (with the memory samples kept so far) into the verdicts behind the
`InputBound`, `Straggler` and `HostMemoryGrowing` conditions, and `next_memory_samples` keeps
the short RSS history the memory check fits.

Everything read from the Lease comes from the trainer and is untrusted: a number that does not
parse, is not finite, is out of range, or a per-worker list of the wrong length is absent
evidence, never an exception. `HealthVerdicts.assessed` says which checks had evidence, so a
caller keeps a condition as it is when a check had none rather than clearing it.
"""

from __future__ import annotations

import itertools
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import NamedTuple, TypeVar

from tpujob.api import contract

_N = TypeVar("_N", int, float)

MIB = 1 << 20
# Bounds a sane trainer never reaches; a value past them is garbage, not a measurement.
MAX_STEP = 10**12
MAX_WORKERS = 10_000
MAX_STEP_SECONDS = 86_400.0
MAX_RSS_BYTES = 1 << 46  # 64 TiB: more than any TPU host has
MAX_TEXT = 24 * MAX_WORKERS  # the longest per-worker list worth splitting
_INT = re.compile(r"[0-9]{1,15}")
# Python's float() also takes "nan", "inf", "1_0" and surrounding space; the trainer writes
# plain decimals, so only those are read.
_FLOAT = re.compile(r"[0-9]{1,15}(\.[0-9]{1,15})?([eE][-+]?[0-9]{1,3})?")


class HealthCheck(StrEnum):
    """The health checks; each value is also the type of the condition it sets."""

    INPUT_BOUND = "InputBound"
    STRAGGLER = "Straggler"
    HOST_MEMORY_GROWING = "HostMemoryGrowing"


class HealthReason(StrEnum):
    """Why a check fired (the condition's reason)."""

    DATA_WAIT_HIGH = "DataWaitHigh"
    WORKER_SLOW = "WorkerSlow"
    TOWARDS_LIMIT = "GrowingTowardsLimit"
    GROWING_WITHOUT_LIMIT = "GrowingWithoutLimit"


@dataclass(frozen=True)
class Finding:
    """A check that fired: the condition's reason and message."""

    reason: HealthReason
    message: str


@dataclass(frozen=True)
class HealthReport:
    """One gather of the workers' health numbers; an empty tuple is an absent list."""

    step: int | None
    input_bound_fraction: float | None
    worker_input_bound: tuple[float, ...] = ()
    worker_step_seconds: tuple[float, ...] = ()
    worker_rss_bytes: tuple[int, ...] = ()

    @property
    def max_rss_bytes(self) -> int | None:
        return max(self.worker_rss_bytes) if self.worker_rss_bytes else None


@dataclass(frozen=True)
class HealthSettings:
    """Thresholds of the health checks."""

    # A slice waiting for data a quarter of its step time leaves the TPUs idle that long;
    # below it, input tuning rarely pays for itself.
    input_bound_fraction: float = 0.25
    # A worker 30% slower than its peers' median costs the whole slice that much per step
    # (a data-parallel step waits for the slowest); smaller gaps are within host noise.
    straggler_excess: float = 0.30
    # Gaps of host time below this are scheduler noise even when the ratio is large.
    straggler_min_gap_seconds: float = 0.01
    # Warn when the fitted growth reaches the memory limit within this horizon: two hours is
    # enough to checkpoint, or for a person to look, before the OOM kill.
    memory_horizon_seconds: float = 2 * 3600.0
    # Without a limit only sustained growth warns: 8 MiB/min is ~11 GiB a day.
    memory_rate_bytes_per_second: float = 8 * MIB / 60
    # The fit needs this many samples over at least this span, so a start-up ramp (data
    # loading, compilation caches) over a minute or two is not read as a leak.
    memory_min_samples: int = 4
    memory_min_span_seconds: float = 600.0
    # A leak that reaches the limit sooner than that span would be killed before it could be
    # warned of. Such growth is judged over a shorter span (at least this long) when every
    # sample is above the one before it: a ramp that levelled off is not steady growth.
    memory_urgent_min_span_seconds: float = 60.0
    # The sample history: at most this many, at least this far apart, none older than the
    # window; an RSS falling by more than this fraction is a restarted process.
    memory_max_samples: int = 30
    memory_sample_interval_seconds: float = 30.0
    memory_window_seconds: float = 3600.0
    memory_drop_fraction: float = 0.2


DEFAULT_HEALTH_SETTINGS = HealthSettings()


class MemorySample(NamedTuple):
    """The largest worker RSS at one time; `step` is the gather's step, to count it once."""

    time_seconds: float
    max_rss_bytes: int
    step: int | None = None


@dataclass(frozen=True)
class HealthVerdicts:
    """Per check: a finding, or None (clear or no evidence; `assessed` tells which)."""

    input_bound: Finding | None = None
    straggler: Finding | None = None
    host_memory_growing: Finding | None = None
    assessed: frozenset[HealthCheck] = frozenset()


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= MAX_TEXT else None


def _float(value: object, *, high: float) -> float | None:
    text = _text(value)
    if text is None or not _FLOAT.fullmatch(text):
        return None
    number = float(text)
    return number if math.isfinite(number) and 0.0 <= number <= high else None


def _int(value: object, *, high: int) -> int | None:
    text = _text(value)
    if text is None or not _INT.fullmatch(text):
        return None
    number = int(text)
    return number if number <= high else None


def _list(value: object, parse: Callable[[object], _N | None], count: int | None) -> tuple[_N, ...]:
    text = _text(value)
    parts = [] if text is None else text.split(",")
    numbers = [parse(p) for p in parts]
    good = [n for n in numbers if n is not None]
    # One bad entry makes the whole list absent: a gap would shift the process ids.
    if (
        len(good) != len(parts)
        or not good
        or len(good) > MAX_WORKERS
        or count not in (None, len(good))
    ):
        return ()
    return tuple(good)


def parse_health(
    annotations: Mapping[str, str], *, workers: int | None = None
) -> HealthReport | None:
    """The health numbers of the Lease's annotations; None when none is usable.

    `workers`, when given, is the job's process count: a per-worker list of another length is
    dropped. The slice's input-bound fraction falls back to the mean of the workers' ones.
    """

    def read(key: str) -> object:
        return annotations.get(key)

    fraction_of = partial(_float, high=1.0)
    worker_input = _list(read(contract.HEARTBEAT_WORKER_INPUT_BOUND), fraction_of, workers)
    fraction = fraction_of(read(contract.HEARTBEAT_INPUT_BOUND_FRACTION))
    if fraction is None and worker_input:
        fraction = statistics.fmean(worker_input)
    report = HealthReport(
        step=_int(read(contract.HEARTBEAT_HEALTH_STEP), high=MAX_STEP),
        input_bound_fraction=fraction,
        worker_input_bound=worker_input,
        worker_step_seconds=_list(
            read(contract.HEARTBEAT_WORKER_STEP_SECONDS),
            partial(_float, high=MAX_STEP_SECONDS),
            workers,
        ),
        worker_rss_bytes=_list(
            read(contract.HEARTBEAT_WORKER_RSS_BYTES), partial(_int, high=MAX_RSS_BYTES), workers
        ),
    )
    usable = (
        report.input_bound_fraction is not None
        or report.worker_input_bound
        or report.worker_step_seconds
        or report.worker_rss_bytes
    )
    return report if usable else None


def next_memory_samples(
    samples: Sequence[MemorySample],
    report_time: float,
    report: HealthReport | None,
    *,
    settings: HealthSettings = DEFAULT_HEALTH_SETTINGS,
) -> tuple[MemorySample, ...]:
    """The sample history after `report`, read at `report_time` (seconds).

    Samples older than the window go; a report of an already sampled step, or sooner than the
    sampling interval, adds nothing; an RSS drop or a step going back (a restarted process)
    starts the history again from the new sample, since the old process's growth says nothing
    of the new one.
    """
    if not math.isfinite(report_time):
        return tuple(samples)
    kept = [
        s
        for s in samples
        if report_time - settings.memory_window_seconds <= s.time_seconds <= report_time
    ]
    rss = None if report is None else report.max_rss_bytes
    if report is None or rss is None:
        return tuple(kept)
    sample = MemorySample(report_time, rss, report.step)
    last = kept[-1] if kept else None
    if last is not None:
        restarted = rss < last.max_rss_bytes * (1 - settings.memory_drop_fraction) or (
            None not in (report.step, last.step) and (report.step or 0) < (last.step or 0)
        )
        if restarted:
            return (sample,)
        if (
            report.step is not None and report.step == last.step
        ) or report_time - last.time_seconds < settings.memory_sample_interval_seconds:
            return tuple(kept)
    return (*kept, sample)[-settings.memory_max_samples :]


@dataclass(frozen=True)
class _Inputs:
    report: HealthReport | None
    pods_by_process: Mapping[int, tuple[str, str]]
    settings: HealthSettings
    samples: tuple[MemorySample, ...]
    limit: int | None
    now: float

    def worker_list(self, values: tuple[float, ...]) -> tuple[float, ...]:
        """`values` when they cover exactly the job's processes, else ()."""
        return values if len(values) == len(self.pods_by_process) else ()

    def where(self, process: int) -> str:
        pod, node = self.pods_by_process.get(process, ("?", "?"))
        return f"worker {process} (pod {pod} on node {node})"


# A check's outcome: None without evidence, else its finding (None when clear).
_Outcome = tuple[Finding | None] | None


def _input_bound(x: _Inputs) -> _Outcome:
    fraction = None if x.report is None else x.report.input_bound_fraction
    if fraction is None:
        return None
    if fraction <= x.settings.input_bound_fraction:
        return (None,)
    message = (
        f"the job waits for input {fraction:.0%} of its step time (threshold "
        f"{x.settings.input_bound_fraction:.0%})"
    )
    workers = x.worker_list(x.report.worker_input_bound) if x.report else ()
    if len(workers) > 1:
        worst = max(range(len(workers)), key=lambda i: workers[i])
        message += f"; most on {x.where(worst)}: {workers[worst]:.0%}"
    message += (
        "; prefetch more batches, give the input pipeline more host threads, or store "
        "the data in a faster format (preprocessed, sharded records)"
    )
    return (Finding(HealthReason.DATA_WAIT_HIGH, message),)


def _straggler(x: _Inputs) -> _Outcome:
    seconds = x.worker_list(x.report.worker_step_seconds) if x.report else ()
    if not seconds:
        return None
    if len(seconds) < 2:
        return (None,)
    # The slowest worker has the largest excess over its peers' median: removing it leaves
    # the smallest median, and every other worker is no slower.
    slowest = max(range(len(seconds)), key=lambda i: (seconds[i], -i))
    peers = statistics.median(sorted(seconds)[:-1])
    gap = seconds[slowest] - peers
    if gap < x.settings.straggler_min_gap_seconds or seconds[slowest] <= peers * (
        1 + x.settings.straggler_excess
    ):
        return (None,)
    excess = f"{gap / peers:.0%} over" if peers > 0 else "against"
    return (
        Finding(
            HealthReason.WORKER_SLOW,
            (
                f"{x.where(slowest)} spends {seconds[slowest]:.3f}s of host time per step, "
                f"{excess} its peers' median of {peers:.3f}s "
                f"(threshold {x.settings.straggler_excess:.0%}); "
                "every step of the job waits for it: look at that node's CPU and neighbours"
            ),
        ),
    )


@dataclass(frozen=True)
class _Fit:
    slope: float  # bytes per second
    now_bytes: float  # the fitted RSS at `now`
    limit: int | None
    settings: HealthSettings

    def rate(self) -> str:
        return f"{self.slope * 60 / MIB:.1f} MiB/min (now {self.now_bytes / MIB:.0f} MiB)"


def _towards_limit(fit: _Fit) -> str | None:
    if fit.limit is None:
        return None
    left = max(0.0, (fit.limit - fit.now_bytes) / fit.slope)
    if left >= fit.settings.memory_horizon_seconds:
        return None
    return (
        f"the largest worker's host memory grows {fit.rate()}; at this rate it reaches "
        f"the limit of {fit.limit / MIB:.0f} MiB in about {left / 60:.0f} min: look for "
        "a leak (caches without bound, references kept to batches or metrics)"
    )


def _growing_without_limit(fit: _Fit) -> str | None:
    if fit.limit is not None or fit.slope < fit.settings.memory_rate_bytes_per_second:
        return None
    return (
        f"the largest worker's host memory grows {fit.rate()} and no memory limit is set, "
        "so no time to an OOM kill can be projected: look for a leak"
    )


# Ordered; the first rule that gives a message fires. No match: clear (the default).
MEMORY_RULES: tuple[tuple[HealthReason, Callable[[_Fit], str | None]], ...] = (
    (HealthReason.TOWARDS_LIMIT, _towards_limit),
    (HealthReason.GROWING_WITHOUT_LIMIT, _growing_without_limit),
)
MEMORY_DEFAULT: Finding | None = None


def _urgent(samples: Sequence[MemorySample], fit: _Fit) -> bool:
    """Whether growth seen for less than the usual span cannot wait for it: steady (every
    sample above the one before) and projected to reach the limit within that span."""
    steady = all(b.max_rss_bytes > a.max_rss_bytes for a, b in itertools.pairwise(samples))
    return (
        steady
        and fit.limit is not None
        and fit.slope > 0
        and (fit.limit - fit.now_bytes) / fit.slope < fit.settings.memory_min_span_seconds
    )


def _memory(x: _Inputs) -> _Outcome:
    s = x.settings
    samples = sorted(
        m
        for m in x.samples
        if math.isfinite(m.time_seconds)
        and 0 <= m.max_rss_bytes <= MAX_RSS_BYTES
        and x.now - s.memory_window_seconds <= m.time_seconds <= x.now
    )
    times = [m.time_seconds for m in samples]
    if (
        len(samples) < s.memory_min_samples
        or max(times) - min(times) < s.memory_urgent_min_span_seconds
    ):
        return None
    slope, intercept = statistics.linear_regression(times, [m.max_rss_bytes for m in samples])
    fit = _Fit(slope, intercept + slope * x.now, x.limit, s)
    if max(times) - min(times) < s.memory_min_span_seconds and not _urgent(samples, fit):
        return None
    # Growth needs a positive slope and a last sample above the first, so noise around a
    # flat line does not count.
    if not slope > 0 or samples[-1].max_rss_bytes <= samples[0].max_rss_bytes:
        return (MEMORY_DEFAULT,)
    for reason, rule in MEMORY_RULES:
        message = rule(fit)
        if message is not None:
            return (Finding(reason, message),)
    return (MEMORY_DEFAULT,)


# The checks in the order they are run; each is independent of the others.
CHECKS: tuple[tuple[HealthCheck, Callable[[_Inputs], _Outcome]], ...] = (
    (HealthCheck.INPUT_BOUND, _input_bound),
    (HealthCheck.STRAGGLER, _straggler),
    (HealthCheck.HOST_MEMORY_GROWING, _memory),
)


_QUANTITY = re.compile(r"([0-9]{1,15})(\.[0-9]{1,9})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
_UNITS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
}


def quantity_bytes(quantity: str | None) -> int | None:
    """Bytes of a memory quantity as Kubernetes writes them (`512Mi`, `4G`, `1.5Gi`, `1000`);
    None for anything else (the API admits no other spelling of memory worth reading)."""
    match = _QUANTITY.fullmatch(quantity) if isinstance(quantity, str) else None
    if match is None:
        return None
    whole, fraction, unit = match.groups()
    number = float(f"{whole}{fraction or ''}") if fraction else int(whole)
    return int(number * _UNITS[unit])


def assess(
    report: HealthReport | None,
    *,
    pods_by_process: Mapping[int, tuple[str, str]],
    settings: HealthSettings = DEFAULT_HEALTH_SETTINGS,
    memory_samples: Sequence[MemorySample],
    memory_limit_bytes: int | None,
    now_seconds: float,
) -> HealthVerdicts:
    """The verdict of each health check on `report` and the memory samples.

    `pods_by_process` maps each process id to its (pod, node); per-worker numbers of another
    count than its size are not used. `memory_limit_bytes` is the trainer container's memory
    limit (None when unset). A check without evidence is left out of `assessed`.
    """
    limit = (
        memory_limit_bytes
        if memory_limit_bytes is not None and 0 < memory_limit_bytes <= MAX_RSS_BYTES
        else None
    )
    now = now_seconds if math.isfinite(now_seconds) else -math.inf
    x = _Inputs(report, pods_by_process, settings, tuple(memory_samples), limit, now)
    found: dict[HealthCheck, Finding | None] = {}
    for check, run in CHECKS:
        outcome = run(x)
        if outcome is not None:
            found[check] = outcome[0]
    return HealthVerdicts(
        input_bound=found.get(HealthCheck.INPUT_BOUND),
        straggler=found.get(HealthCheck.STRAGGLER),
        host_memory_growing=found.get(HealthCheck.HOST_MEMORY_GROWING),
        assessed=frozenset(found),
    )
