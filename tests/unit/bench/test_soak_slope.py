"""The soak's leak figure (bench/bench_soak.py): the least-squares slope after the warm-up."""

from __future__ import annotations

import pytest
from bench.bench_soak import slope_per_hour


def test_slope_is_in_units_per_hour() -> None:
    samples = [(t, 100 + 2 * t / 60) for t in range(0, 3600, 10)]  # 2 MiB a minute
    assert slope_per_hour(samples) == pytest.approx(120)


def test_warm_up_growth_is_left_out() -> None:
    # Caches fill in the first 10 % of the run, then memory stays flat.
    samples = [(float(t), 50 + t if t < 360 else 410.0) for t in range(0, 3600, 10)]
    assert slope_per_hour(samples) == pytest.approx(0)
    assert slope_per_hour(samples, warmup=0) > 0


def test_flat_samples_have_no_slope() -> None:
    assert slope_per_hour([(t, 7.0) for t in range(0, 600, 10)]) == pytest.approx(0)


@pytest.mark.parametrize(
    "samples", [[], [(0.0, 1.0)], [(5.0, 1.0), (5.0, 2.0)]], ids=["none", "one", "one-instant"]
)
def test_too_few_samples_give_no_slope(samples: list[tuple[float, float]]) -> None:
    assert slope_per_hour(samples) is None
