"""The scale benchmark's summaries and plots (bench/scale/report.py): medians with their spread."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from bench.bench_scale import report, runs_per_arm


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ({"median": 10.0, "min": 7.0, "max": 12.5}, (10.0, 3.0, 2.5)),
        ({"median": 4.0, "min": 4.0, "max": 4.0}, (4.0, 0.0, 0.0)),
        ({"median": None, "min": None, "max": None}, (math.nan, 0.0, 0.0)),
        ({}, (math.nan, 0.0, 0.0)),
    ],
    ids=["spread", "one-run", "no-run-had-it", "figure-absent"],
)
def test_error_bars_reach_from_the_median_to_the_min_and_max(
    cell: dict[str, Any], expected: tuple[float, float, float]
) -> None:
    ys, low, high = report._error_bars([cell])
    assert (low[0], high[0]) == expected[1:]
    assert ys[0] == expected[0] or (math.isnan(ys[0]) and math.isnan(expected[0]))


def _ladder_run(arm: str, run: int, p50: float) -> dict[str, Any]:
    curve = [[float(t), min(1000, 5 * t)] for t in range(0, 220, 10)]
    return {
        "scenario": "ladder",
        "size": 250,
        "arm": arm,
        "run": run,
        "result": {
            "create_to_running_s": {"n": 250, "p50": p50, "p99": p50 + 90, "max": p50 + 95},
            "makespan_s": 210.0,
            "workloads_running": 250,
            "running_pods_over_time": curve,
            "pod_stages_over_time": [[t, n + 40, n + 20, n, 10] for t, n in curve],
        },
    }


def test_a_ladder_of_one_size_plots_every_run_and_the_spread(tmp_path: Path) -> None:
    runs = [_ladder_run(arm, k, 100 + k) for arm in ("tpujob", "jobset") for k in range(3)]
    summary = report.summarize("ladder", runs)
    assert summary["250"]["tpujob"]["create_to_running_s.p50"] == {
        "median": 101,
        "min": 100,
        "max": 102,
        "runs": 3,
        "runs_without": 0,
    }
    report.plot("ladder", runs, summary, tmp_path / "ladder.png")
    assert (tmp_path / "ladder.png").stat().st_size > 10_000


def test_runs_per_arm_counts_the_records_appended_runs_included() -> None:
    first = [{"size": 250, "arm": a, "run": 0} for a in ("tpujob", "jobset")]
    appended = [{"size": 250, "arm": a, "run": k} for k in (1, 2) for a in ("tpujob", "jobset")]
    assert runs_per_arm(first) == 1
    assert runs_per_arm(first + appended) == 3
    assert runs_per_arm([]) == 0
