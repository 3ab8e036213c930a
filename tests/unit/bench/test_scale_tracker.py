"""The scale benchmark's pod tracker (bench/scale/tracker.py): pods counted at each stage, from
the watch events it is fed."""

from __future__ import annotations

from typing import Any

import pytest
from bench.bench_scale import scenarios


def _pod(name: str, *, node: str = "", phase: str = "Pending", deleting: bool = False) -> Any:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    spec = {"nodeName": node} if node else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([("ADDED", _pod("tj-0001-0-0-0"))], (1, 0, 0)),
        ([("ADDED", _pod("tj-0001-0-0-0", node="n1"))], (1, 1, 0)),
        ([("ADDED", _pod("tj-0001-0-0-0", node="n1", phase="Running"))], (1, 1, 1)),
        (
            [
                ("ADDED", _pod("tj-0001-0-0-0", node="n1", phase="Running")),
                ("MODIFIED", _pod("tj-0001-0-0-0", node="n1", phase="Running", deleting=True)),
            ],
            (0, 0, 0),
        ),
        (
            [
                ("ADDED", _pod("tj-0001-0-0-0", node="n1")),
                ("ADDED", _pod("tj-0001-0-0-1")),
                ("DELETED", _pod("tj-0001-0-0-0", node="n1")),
            ],
            (1, 0, 0),
        ),
        ([("ADDED", _pod("not-a-workload"))], (0, 0, 0)),
    ],
    ids=["created", "bound", "running", "being-deleted", "deleted", "not-ours"],
)
def test_stage_counts_place_each_live_pod_at_its_furthest_stage(
    events: list[tuple[str, Any]], expected: tuple[int, int, int]
) -> None:
    tracker = scenarios.Tracker(api=None, namespace="bench", pods_per_workload=4)
    for kind, pod in events:
        tracker._on(kind, pod)
    assert tracker.stage_counts() == expected
