"""A lost node's mark outlives its job only until the node has been back long enough."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from tests.unit.builders import at, job_body, node
from tests.unit.fakes import FakeReader, RecordingWriter, deps_for

from tpujob.api import BadNodeAction, labels
from tpujob.controller.sweeps import sweep_orphaned_marks
from tpujob.observed.views import node_view
from tpujob.plan.marks import orphaned_marks

NOW = at(1000)
GONE = "ci/run-41: NODE_LOST"


def marked(reason: str, name: str = "n0", **kwargs: Any) -> dict[str, Any]:
    kwargs.setdefault("ready_since", at(100))
    raw = node(name, "pool-0", taints=(labels.BAD_NODE_TAINT,), **kwargs)
    raw["metadata"]["annotations"] = {labels.BAD_NODE_REASON: reason}
    return raw


@pytest.mark.parametrize(
    ("case", "raw", "live", "cleared"),
    [
        ("the job is gone and the node back for 900 s", marked(GONE), set(), True),
        (
            "the job still exists: it takes its own mark off",
            marked(GONE),
            {("ci", "run-41")},
            False,
        ),
        ("back for less than the return time", marked(GONE, ready_since=at(800)), set(), False),
        ("not Ready", marked(GONE, ready="False", ready_since=at(100)), set(), False),
        ("its TPUs held back", marked(GONE, tpu_unhealthy=True), set(), False),
        (
            "a mark for a broken TPU, not a lost node",
            marked("ci/run-41: TPU_UNHEALTHY"),
            set(),
            False,
        ),
        ("a mark made by an administrator", marked("replaced the host board"), set(), False),
    ],
)
def test_an_orphaned_mark_of_a_lost_node_is_cleared_once_the_node_is_back(
    case: str, raw: dict[str, Any], live: set[tuple[str, str]], cleared: bool
) -> None:
    marks = orphaned_marks([node_view(raw)], live, now=NOW, return_after=300)
    assert bool(marks) is cleared, case
    if cleared:
        assert marks[0].clear and marks[0].reason == GONE
        assert marks[0].action is BadNodeAction.TAINT


def test_the_operator_sweeps_orphaned_marks_from_its_cache() -> None:
    live = job_body()  # team/train, whose marks are its own to take off
    reader = FakeReader(
        [], body=live, nodes=[marked(GONE), marked("team/train: NODE_LOST", name="n1")]
    )
    writer = RecordingWriter()
    deps = deps_for(reader, writer)
    deps.clock = lambda: NOW
    assert asyncio.run(sweep_orphaned_marks(deps)) == ["n0"]
    assert writer.calls == [("mark", "n0")]
