"""Percentiles of one run and the median and spread of several."""

from __future__ import annotations

import statistics
from typing import Any


def pct(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return round(s[lo] + (s[hi] - s[lo]) * (k - lo), 3)


def dist(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": pct(values, 50),
        "p99": pct(values, 99),
        "max": round(max(values), 3) if values else None,
    }


def spread(values: list[float | None]) -> dict[str, Any]:
    """Median and min/max over runs; runs without the figure are counted, not hidden."""
    got = [v for v in values if v is not None]
    return {
        "median": round(statistics.median(got), 3) if got else None,
        "min": min(got) if got else None,
        "max": max(got) if got else None,
        "runs": len(values),
        "runs_without": len(values) - len(got),
    }
