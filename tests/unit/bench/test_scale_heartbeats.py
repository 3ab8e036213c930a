"""The fake nodes' heartbeats read back from kwok's log (bench/scale/heartbeats.py): a run whose
nodes were late renewing their Leases past the controller-manager's grace says so."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_scale import heartbeats


def _line(node: str, at: str, msg: str = "Syncing lease") -> str:
    return json.dumps({"time": f"2026-12-07T19:{at}.5Z", "level": "INFO", "msg": msg, "node": node})


LOG = [
    _line("n0", "00:00", "Creating lease"),
    _line("n1", "00:00", "Creating lease"),
    json.dumps({"time": "2026-12-07T19:00:05Z", "msg": "Patch pod", "node": "n0"}),
    _line("n0", "00:10"),
    _line("n1", "01:30"),  # 90 s: past a 50 s grace
    _line("n0", "00:20"),
    "not json at all: Syncing lease",
    _line("n1", "01:40"),
]


def test_gaps_are_per_node_and_only_between_renewals() -> None:
    assert heartbeats.gaps(LOG) == [("n0", 10.0), ("n1", 90.0), ("n0", 10.0), ("n1", 10.0)]


def test_the_summary_counts_renewals_later_than_the_grace(tmp_path: Path) -> None:
    log = tmp_path / "kwok.log"
    log.write_text("\n".join(LOG) + "\n")
    assert heartbeats.summary(log, grace_seconds=50) == {
        "gap_s": {"n": 4, "p50": 10.0, "p99": 87.6, "max": 90.0},
        "grace_s": 50,
        "gaps_past_grace": 1,
        "nodes_past_grace": 1,
    }
    assert heartbeats.summary(log, grace_seconds=120)["gaps_past_grace"] == 0


def test_a_run_without_kwoks_log_records_nothing(tmp_path: Path) -> None:
    assert heartbeats.summary(tmp_path / "absent.log", grace_seconds=50) == {}
