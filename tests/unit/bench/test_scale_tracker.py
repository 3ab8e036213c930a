"""The scale benchmark's pod tracker (bench/scale/tracker.py): pods counted at each stage, from
the watch events it is fed."""

from __future__ import annotations

from typing import Any

import pytest
from bench.bench_scale import scenarios
from scale import tracker as tracker_module

REFUSED = "0/8 nodes are available: 8 node(s) didn't match Pod's node affinity/selector."


def _pod(
    name: str,
    *,
    node: str = "",
    phase: str = "Pending",
    deleting: bool = False,
    refused: bool = False,
) -> Any:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    spec = {"nodeName": node} if node else {}
    status: dict[str, Any] = {"phase": phase}
    if refused:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": REFUSED,
            }
        ]
    return {"metadata": meta, "spec": spec, "status": status}


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ([("ADDED", _pod("tj-0001-0-0-0"))], (1, 0, 0, 0)),
        ([("ADDED", _pod("tj-0001-0-0-0", node="n1"))], (1, 1, 0, 0)),
        ([("ADDED", _pod("tj-0001-0-0-0", node="n1", phase="Running"))], (1, 1, 1, 0)),
        ([("ADDED", _pod("tj-0001-0-0-0", refused=True))], (1, 0, 0, 1)),
        (
            [
                ("ADDED", _pod("tj-0001-0-0-0", refused=True)),
                ("MODIFIED", _pod("tj-0001-0-0-0", node="n1")),
            ],
            (1, 1, 0, 0),
        ),
        (
            [
                ("ADDED", _pod("tj-0001-0-0-0", node="n1", phase="Running")),
                ("MODIFIED", _pod("tj-0001-0-0-0", node="n1", phase="Running", deleting=True)),
            ],
            (0, 0, 0, 0),
        ),
        (
            [
                ("ADDED", _pod("tj-0001-0-0-0", node="n1")),
                ("ADDED", _pod("tj-0001-0-0-1")),
                ("DELETED", _pod("tj-0001-0-0-0", node="n1")),
            ],
            (1, 0, 0, 0),
        ),
        ([("ADDED", _pod("not-a-workload"))], (0, 0, 0, 0)),
    ],
    ids=[
        "created",
        "bound",
        "running",
        "refused",
        "bound-after-refusal",
        "being-deleted",
        "deleted",
        "not-ours",
    ],
)
def test_stage_counts_place_each_live_pod_at_its_furthest_stage(
    events: list[tuple[str, Any]], expected: tuple[int, int, int, int]
) -> None:
    tracker = scenarios.Tracker(api=None, namespace="bench", pods_per_workload=4)
    for kind, pod in events:
        tracker._on(kind, pod)
    assert tracker.stage_counts() == expected


def test_the_schedulers_words_are_counted_and_their_variety_bounded() -> None:
    tracker = scenarios.Tracker(api=None, namespace="bench", pods_per_workload=4)
    for k in range(3):
        tracker._on("ADDED", _pod(f"tj-0001-0-0-{k}", refused=True))
    assert tracker.unschedulable_messages == {REFUSED: 3}
    for k in range(2 * tracker_module.MESSAGES_KEPT):
        pod = _pod(f"tj-0002-0-0-{k}", refused=True)
        pod["status"]["conditions"][0]["message"] = f"0/{k} nodes are available"
        tracker._on("ADDED", pod)
    assert len(tracker.unschedulable_messages) == tracker_module.MESSAGES_KEPT
