"""The operator's Prometheus metrics, read back through the exposition format."""

from __future__ import annotations

from prometheus_client import generate_latest

from tpujob.api import GoodputBreakdown, Phase
from tpujob.controller.metrics import Metrics


def scrape(metrics: Metrics) -> dict[str, float]:
    values = {}
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_jobs_by_phase_follow_each_jobs_latest_phase() -> None:
    metrics = Metrics()
    metrics.record_job("a", "one", Phase.RUNNING, 0.9, 1)
    metrics.record_job("a", "two", Phase.RUNNING, None, None)
    metrics.record_job("a", "one", Phase.RECOVERING, 0.8, 0)
    values = scrape(metrics)
    assert values['tpujob_jobs{phase="Running"}'] == 1
    assert values['tpujob_jobs{phase="Recovering"}'] == 1
    assert values['tpujob_goodput_ratio{job="one",namespace="a"}'] == 0.8
    assert values['tpujob_failed_node_budget_remaining{job="one",namespace="a"}'] == 0
    metrics.forget_job("a", "one")
    assert 'tpujob_goodput_ratio{job="one",namespace="a"}' not in scrape(metrics)


def test_failures_restarts_and_recovery_durations_are_counted() -> None:
    metrics = Metrics()
    metrics.record_failure("hard", "NODE_LOST", restarted=True)
    metrics.record_failure("fatal", "SHAPE_MISMATCH", restarted=False)
    metrics.record_recovery(12.5)
    values = scrape(metrics)
    assert values['tpujob_failures_total{class="hard",code="NODE_LOST"}'] == 1
    assert values['tpujob_restarts_total{class="hard"}'] == 1
    assert 'tpujob_restarts_total{class="fatal"}' not in values
    assert values["tpujob_recovery_duration_seconds_count"] == 1
    assert values['tpujob_recovery_duration_seconds_bucket{le="20.0"}'] == 1


def test_the_goodput_breakdown_is_exported_per_category_and_forgotten_with_the_job() -> None:
    metrics = Metrics()
    parts = GoodputBreakdown(wall_seconds=100, productive=90, downtime=10, queued=5, degraded=30)
    metrics.record_breakdown("a", "one", parts)
    values = scrape(metrics)
    assert values['tpujob_goodput_seconds{category="productive",job="one",namespace="a"}'] == 90
    metrics.record_breakdown("a", "one", parts.model_copy(update={"productive": 95}))
    values = scrape(metrics)
    assert values['tpujob_goodput_seconds{category="productive",job="one",namespace="a"}'] == 95
    metrics.forget_job("a", "one")
    assert not any(k.startswith("tpujob_goodput_seconds{") for k in scrape(metrics))


def test_a_job_recorded_again_after_it_was_forgotten_shows_again() -> None:
    """Unchanged values are not set again; a forgotten job's are, as its series went."""
    metrics = Metrics()
    parts = GoodputBreakdown(wall_seconds=100, productive=90)
    for _ in range(2):
        metrics.record_job("a", "one", Phase.RUNNING, 0.9, 1)
        metrics.record_breakdown("a", "one", parts)
        values = scrape(metrics)
        assert values['tpujob_goodput_ratio{job="one",namespace="a"}'] == 0.9
        assert values['tpujob_goodput_seconds{category="productive",job="one",namespace="a"}'] == 90
        metrics.forget_job("a", "one")
        assert not any('job="one"' in k for k in scrape(metrics))


def test_a_breakdown_follows_the_status_writes_but_a_job_without_series_shows_at_once() -> None:
    metrics = Metrics()
    parts = GoodputBreakdown(wall_seconds=100, productive=90)
    metric = 'tpujob_goodput_seconds{category="productive",job="one",namespace="a"}'
    metrics.record_breakdown("a", "one", parts, written=False)  # first seen: shown
    assert scrape(metrics)[metric] == 90
    later = parts.model_copy(update={"productive": 95})
    metrics.record_breakdown("a", "one", later, written=False)  # only the clock moved
    assert scrape(metrics)[metric] == 90
    metrics.record_breakdown("a", "one", later, written=True)
    assert scrape(metrics)[metric] == 95
