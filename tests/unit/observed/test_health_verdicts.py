"""Training health: the trainer's numbers are range-checked, then judged into conditions."""

from __future__ import annotations

import pytest

from tpujob.api import contract
from tpujob.observed.training import (
    MIB,
    HealthCheck,
    HealthReason,
    HealthReport,
    HealthSettings,
    MemorySample,
    assess,
    next_memory_samples,
    parse_health,
    quantity_bytes,
)

GOOD = {
    contract.HEARTBEAT_HEALTH_STEP: "40",
    contract.HEARTBEAT_INPUT_BOUND_FRACTION: "0.1500",
    # Not the mean of the slice fraction, so the tests tell which one was read.
    contract.HEARTBEAT_WORKER_INPUT_BOUND: "0.1000,0.3000",
    contract.HEARTBEAT_WORKER_STEP_SECONDS: "0.2000,0.9000",
    contract.HEARTBEAT_WORKER_RSS_BYTES: f"{256 * MIB},{512 * MIB}",
}
PODS = {
    0: ("job-1-0-0", "node-a"),
    1: ("job-1-0-1", "node-b"),
    2: ("job-1-0-2", "node-c"),
    3: ("job-1-0-3", "node-d"),
}


def test_the_trainers_annotations_read_back_as_a_report() -> None:
    assert parse_health(GOOD) == HealthReport(
        step=40,
        input_bound_fraction=0.15,
        worker_input_bound=(0.1, 0.3),
        worker_step_seconds=(0.2, 0.9),
        worker_rss_bytes=(256 * MIB, 512 * MIB),
    )


BAD_NUMBERS = ["nan", "inf", "-1", "1e999", "abc", "", " 5", "1_0", "0x10", "9" * 40]


@pytest.mark.parametrize("text", BAD_NUMBERS)
@pytest.mark.parametrize(
    ("key", "field", "absent"),
    [
        (contract.HEARTBEAT_HEALTH_STEP, "step", None),
        # An unreadable slice fraction falls back to the workers' mean.
        (contract.HEARTBEAT_INPUT_BOUND_FRACTION, "input_bound_fraction", pytest.approx(0.2)),
        (contract.HEARTBEAT_WORKER_STEP_SECONDS, "worker_step_seconds", ()),
        (contract.HEARTBEAT_WORKER_RSS_BYTES, "worker_rss_bytes", ()),
    ],
)
def test_a_garbage_number_is_absent_and_leaves_the_rest(
    key: str, field: str, absent: object, text: str
) -> None:
    report = parse_health({**GOOD, key: text})
    assert report is not None
    assert getattr(report, field) == absent
    assert report.worker_input_bound == (0.1, 0.3)


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (contract.HEARTBEAT_WORKER_INPUT_BOUND, "0.5,1.5"),  # a fraction above one
        (contract.HEARTBEAT_WORKER_STEP_SECONDS, "0.2,nan"),  # one bad worker spoils the list
        (contract.HEARTBEAT_WORKER_STEP_SECONDS, "0.2,,0.3"),
        (contract.HEARTBEAT_WORKER_STEP_SECONDS, "0.2,900000"),  # a step of ten days
        (contract.HEARTBEAT_WORKER_RSS_BYTES, f"{1 << 50},1"),  # a petabyte of host memory
        (contract.HEARTBEAT_WORKER_RSS_BYTES, "1.5,2"),  # bytes are whole
        (contract.HEARTBEAT_HEALTH_STEP, "10000000000000"),
    ],
)
def test_an_out_of_range_value_is_absent(key: str, text: str) -> None:
    report = parse_health({**GOOD, key: text})
    assert report is not None
    field = {
        contract.HEARTBEAT_WORKER_INPUT_BOUND: report.worker_input_bound,
        contract.HEARTBEAT_WORKER_STEP_SECONDS: report.worker_step_seconds,
        contract.HEARTBEAT_WORKER_RSS_BYTES: report.worker_rss_bytes,
        contract.HEARTBEAT_HEALTH_STEP: report.step,
    }[key]
    assert field in (None, ())


def test_lists_of_another_worker_count_are_dropped_when_the_count_is_known() -> None:
    report = parse_health(GOOD, workers=3)
    assert report is not None
    assert (report.worker_step_seconds, report.worker_rss_bytes) == ((), ())
    assert report.input_bound_fraction == 0.15


def test_the_slice_fraction_falls_back_to_the_workers_mean() -> None:
    notes = {k: v for k, v in GOOD.items() if k != contract.HEARTBEAT_INPUT_BOUND_FRACTION}
    report = parse_health(notes)
    assert report is not None
    assert report.input_bound_fraction == pytest.approx(0.2)


@pytest.mark.parametrize(
    "notes", [{}, {contract.HEARTBEAT_HEALTH_STEP: "4"}, {k: "garbage" for k in GOOD}], ids=str
)
def test_no_usable_number_is_no_report(notes: dict[str, str]) -> None:
    assert parse_health(notes) is None


def report(
    fraction: float | None = None, workers: tuple[float, ...] = (), seconds: tuple[float, ...] = ()
) -> HealthReport:
    return HealthReport(
        step=40,
        input_bound_fraction=fraction,
        worker_input_bound=workers,
        worker_step_seconds=seconds,
    )


@pytest.mark.parametrize(
    ("fraction", "fires"), [(0.40, True), (0.26, True), (0.25, False), (0.0, False)]
)
def test_input_bound_fires_above_the_threshold_with_the_fraction_and_advice(
    fraction: float, fires: bool
) -> None:
    verdicts = assess(
        report(fraction, (fraction,) * 3 + (0.9,)),
        pods_by_process=PODS,
        memory_samples=(),
        memory_limit_bytes=None,
        now_seconds=0.0,
    )
    assert HealthCheck.INPUT_BOUND in verdicts.assessed
    finding = verdicts.input_bound
    assert (finding is not None) == fires
    if finding is not None:
        assert finding.reason is HealthReason.DATA_WAIT_HIGH
        assert f"{fraction:.0%}" in finding.message
        assert "worker 3 (pod job-1-0-3 on node node-d): 90%" in finding.message
        assert all(w in finding.message for w in ("prefetch", "host threads", "format"))


def test_no_input_fraction_is_no_evidence() -> None:
    verdicts = assess(
        report(None),
        pods_by_process=PODS,
        memory_samples=(),
        memory_limit_bytes=None,
        now_seconds=0.0,
    )
    assert verdicts.input_bound is None
    assert HealthCheck.INPUT_BOUND not in verdicts.assessed


STRAGGLERS = {
    "one worker far over its peers is named": ((0.2, 0.21, 0.9, 0.2), 2),
    "the slowest of two slow workers is named": ((0.2, 0.7, 0.9, 0.2), 2),
    "two workers: the other one is the peer median": ((0.2, 0.5), 1),
    "29% over the median is within the threshold": ((0.2, 0.258, 0.2, 0.2), None),
    "a large ratio of tiny host times is noise": ((0.001, 0.004, 0.001, 0.001), None),
    "equal workers": ((0.3, 0.3, 0.3, 0.3), None),
    "one worker has no peers": ((5.0,), None),
}


@pytest.mark.parametrize(("seconds", "slow"), STRAGGLERS.values(), ids=STRAGGLERS.keys())
def test_a_straggler_is_the_worker_slower_than_its_peers_median_by_the_threshold(
    seconds: tuple[float, ...], slow: int | None
) -> None:
    pods = {p: PODS[p] for p in range(len(seconds))}
    verdicts = assess(
        report(seconds=seconds),
        pods_by_process=pods,
        memory_samples=(),
        memory_limit_bytes=None,
        now_seconds=0.0,
    )
    assert HealthCheck.STRAGGLER in verdicts.assessed
    finding = verdicts.straggler
    assert (finding.message.split(" (")[0] if finding else None) == (
        f"worker {slow}" if slow is not None else None
    )
    if finding is not None and slow is not None:
        assert finding.reason is HealthReason.WORKER_SLOW
        pod, node = PODS[slow]
        assert f"pod {pod} on node {node}" in finding.message


def test_step_times_of_another_count_than_the_pods_are_no_evidence() -> None:
    verdicts = assess(
        report(seconds=(0.2, 0.9)),
        pods_by_process=PODS,
        memory_samples=(),
        memory_limit_bytes=None,
        now_seconds=0.0,
    )
    assert verdicts.straggler is None
    assert HealthCheck.STRAGGLER not in verdicts.assessed


def growing(
    mib_per_minute: float, *, start_mib: float = 1024, times: tuple[float, ...] = (0, 300, 600, 900)
) -> tuple[MemorySample, ...]:
    return tuple(MemorySample(t, int((start_mib + mib_per_minute * t / 60) * MIB)) for t in times)


MEMORY = {
    # 10 MiB/min from 1024 MiB: 1174 MiB at 900 s; 600 MiB left is an hour.
    "an hour from the limit warns with the rate and the time": (
        growing(10),
        1774 * MIB,
        HealthReason.TOWARDS_LIMIT,
        ("10.0 MiB/min", "about 60 min"),
    ),
    "three hours from the limit is clear": (growing(10), 2974 * MIB, None, ()),
    "past the limit already warns at zero minutes": (
        growing(10),
        1100 * MIB,
        HealthReason.TOWARDS_LIMIT,
        ("about 0 min",),
    ),
    "no limit and fast growth warns that no limit is set": (
        growing(10),
        None,
        HealthReason.GROWING_WITHOUT_LIMIT,
        ("10.0 MiB/min", "no memory limit is set"),
    ),
    "no limit and slow growth is clear": (growing(4), None, None, ()),
    "shrinking memory is clear": (growing(-10), 1100 * MIB, None, ()),
    "a nonsense limit counts as none": (
        growing(10),
        -5,
        HealthReason.GROWING_WITHOUT_LIMIT,
        ("no memory limit",),
    ),
}


@pytest.mark.parametrize(
    ("samples", "limit", "reason", "words"), MEMORY.values(), ids=MEMORY.keys()
)
def test_host_memory_growth_is_fitted_and_projected_to_the_limit(
    samples: tuple[MemorySample, ...],
    limit: int | None,
    reason: HealthReason | None,
    words: tuple[str, ...],
) -> None:
    verdicts = assess(
        None,
        pods_by_process=PODS,
        memory_samples=samples,
        memory_limit_bytes=limit,
        now_seconds=900.0,
    )
    assert HealthCheck.HOST_MEMORY_GROWING in verdicts.assessed
    finding = verdicts.host_memory_growing
    assert (finding.reason if finding else None) is reason
    assert all(w in (finding.message if finding else "") for w in words)


@pytest.mark.parametrize(
    ("samples", "now"),
    [
        (growing(50, times=(0, 300, 600)), 600.0),  # three samples
        (growing(50, times=(0, 100, 200, 300)), 300.0),  # five minutes: maybe a start-up ramp
        (growing(50), 9000.0),  # samples older than the window
        (growing(50), float("nan")),
    ],
    ids=["few", "short", "stale", "no clock"],
)
def test_memory_without_enough_samples_is_no_evidence(
    samples: tuple[MemorySample, ...], now: float
) -> None:
    # The limit is hours away, so growth over a short span has to wait for the usual span.
    verdicts = assess(
        None,
        pods_by_process=PODS,
        memory_samples=samples,
        memory_limit_bytes=16 << 30,
        now_seconds=now,
    )
    assert verdicts.host_memory_growing is None
    assert HealthCheck.HOST_MEMORY_GROWING not in verdicts.assessed


URGENT = {
    # 480 MiB/min from 512 MiB: 1232 MiB at 90 s, 300 MiB (about 40 s) left.
    "steady growth that will not last the usual span warns at once": (
        growing(480, start_mib=512, times=(0, 30, 60, 90)),
        1536 * MIB,
        HealthReason.TOWARDS_LIMIT,
        "limit of 1536 MiB in about 1 min",
    ),
    "a ramp that levelled off waits for the usual span": (
        tuple(MemorySample(t, m * MIB) for t, m in ((0, 512), (30, 1000), (60, 1300), (90, 1300))),
        1536 * MIB,
        None,
        "",
    ),
    "no limit: nothing to be killed by sooner, so the usual span": (
        growing(480, start_mib=512, times=(0, 30, 60, 90)),
        None,
        None,
        "",
    ),
    "under a minute is too short even for a fast leak": (
        growing(480, start_mib=512, times=(0, 15, 30, 45)),
        1536 * MIB,
        None,
        "",
    ),
}


@pytest.mark.parametrize(("samples", "limit", "reason", "says"), URGENT.values(), ids=URGENT.keys())
def test_a_leak_faster_than_the_usual_span_is_warned_of_before_its_oom_kill(
    samples: tuple[MemorySample, ...], limit: int | None, reason: HealthReason | None, says: str
) -> None:
    now = samples[-1].time_seconds
    verdicts = assess(
        None,
        pods_by_process=PODS,
        memory_samples=samples,
        memory_limit_bytes=limit,
        now_seconds=now,
    )
    finding = verdicts.host_memory_growing
    assert (finding.reason if finding else None) is reason
    assert says in (finding.message if finding else "")
    if reason is None:
        assert HealthCheck.HOST_MEMORY_GROWING not in verdicts.assessed


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("1536Mi", 1536 * MIB),
        ("2Gi", 2 << 30),
        ("4G", 4 * 10**9),
        ("1.5Gi", 3 << 29),
        ("1000", 1000),
        ("129M", 129 * 10**6),
        (None, None),
        ("", None),
        ("-1Gi", None),
        ("1Gb", None),
        ("500m", None),
    ],
    ids=repr,
)
def test_memory_quantities_read_as_bytes(quantity: str | None, expected: int | None) -> None:
    assert quantity_bytes(quantity) == expected


def rss(step: int | None, mib: int) -> HealthReport:
    return HealthReport(step=step, input_bound_fraction=None, worker_rss_bytes=(mib * MIB, 1))


SAMPLING = {
    "a new gather adds its largest worker": (
        ((0, 100, 20),),
        60,
        rss(40, 110),
        ((0, 100, 20), (60, 110, 40)),
    ),
    "the same gather again adds nothing": (((0, 100, 20),), 60, rss(20, 100), ((0, 100, 20),)),
    "sooner than the interval adds nothing": (((0, 100, 20),), 10, rss(40, 101), ((0, 100, 20),)),
    "an RSS drop is a restarted process: the history starts again": (
        ((0, 100, 20), (60, 200, 40)),
        120,
        rss(60, 120),
        ((120, 120, 60),),
    ),
    "a step going back is a restarted process": (
        ((0, 100, 20), (60, 110, 40)),
        120,
        rss(10, 110),
        ((120, 110, 10),),
    ),
    "samples older than the window go": (
        ((0, 100, 20), (3000, 110, 40)),
        3700,
        rss(60, 120),
        ((3000, 110, 40), (3700, 120, 60)),
    ),
    "no report keeps the history": (((0, 100, 20),), 60, None, ((0, 100, 20),)),
    "a time that is not a number changes nothing": (
        ((0, 100, 20),),
        float("inf"),
        rss(40, 110),
        ((0, 100, 20),),
    ),
}


@pytest.mark.parametrize(("before", "time", "new", "after"), SAMPLING.values(), ids=SAMPLING.keys())
def test_the_memory_history_keeps_one_sample_per_gather_of_the_same_process(
    before: tuple[tuple[float, int, int], ...],
    time: float,
    new: HealthReport | None,
    after: tuple[tuple[float, int, int], ...],
) -> None:
    def samples(rows: tuple[tuple[float, int, int], ...]) -> tuple[MemorySample, ...]:
        return tuple(MemorySample(t, m * MIB, s) for t, m, s in rows)

    assert next_memory_samples(samples(before), time, new) == samples(after)


def test_the_memory_history_is_bounded() -> None:
    history: tuple[MemorySample, ...] = ()
    for n in range(100):
        history = next_memory_samples(history, n * 30.0, rss(n, 100 + n))
    assert len(history) == HealthSettings().memory_max_samples
    assert history[-1] == MemorySample(99 * 30.0, 199 * MIB, 99)
