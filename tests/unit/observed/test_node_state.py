"""One node interpreter: the instant's readings and the debounced verdict never disagree."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from tests.unit.builders import at, job_body, node, observed, pod, running_status

from tpujob.api import labels
from tpujob.observed.nodes import down_now, judge, lost, placeable
from tpujob.observed.views import NodeView, node_view
from tpujob.plan import plan

NOW = at(100)


def view(**kwargs: Any) -> NodeView:
    return node_view(node("n0", "pool-0", **kwargs))


def unreachable() -> NodeView:
    raw = node("n0", "pool-0", ready="Unknown", ready_since=at(99))
    raw["spec"]["taints"] = [{"key": labels.UNREACHABLE_TAINT, "effect": labels.NO_EXECUTE}]
    return node_view(raw)


@pytest.mark.parametrize(
    ("case", "node_", "is_down", "is_placeable", "is_lost"),
    [
        ("ready", view(), False, True, False),
        ("not ready for two seconds", view(ready="False", ready_since=at(98)), True, False, False),
        ("not ready past the grace", view(ready="False", ready_since=at(50)), True, False, True),
        ("not ready since an unknown time", view(ready="Unknown"), True, False, True),
        ("given up by the node controller", unreachable(), True, False, True),
        ("gone", None, True, False, True),
        ("cordoned", view(unschedulable=True), False, False, False),
        ("TPUs held back", view(tpu_unhealthy=True), False, False, False),
        ("marked bad", view(taints=(labels.BAD_NODE_TAINT,)), False, False, False),
    ],
)
def test_every_reader_gets_one_meaning_of_a_node(
    case: str, node_: NodeView | None, is_down: bool, is_placeable: bool, is_lost: bool
) -> None:
    assert (node_ is None or down_now(node_)) is is_down, case
    assert (node_ is not None and placeable(node_)) is is_placeable, case
    assert lost(node_, now=NOW) is is_lost, case
    # The debounced verdict behind `lost` is the one the diagnosis reads.
    assert judge(node_, now=NOW, name="n0").trouble.lost is is_lost, case


def stuck_on(node_ready_since: datetime) -> dict[str, float | None]:
    """What a reconcile at NOW does with an old pod stuck terminating for 15 s on a node
    that has not been Ready since `node_ready_since`."""
    job = job_body(
        status={
            **running_status(attempt=2),
            "currentAttempt": {"placement": [{"slice": 0, "nodePool": "pool-1"}]},
        }
    )
    nodes = [
        node(f"pool-{p}-w{w}", f"pool-{p}")
        if (p, w) != (0, 1)
        else node("pool-0-w1", "pool-0", ready="False", ready_since=node_ready_since)
        for p in range(3)
        for w in range(2)
    ]
    old = [pod(job, 1, 0, 1, deleting=85)]
    result = plan(observed(job, old, nodes=nodes), now=NOW)
    return {d.name: d.grace_seconds for d in result.delete_pods}


def test_a_pod_on_a_node_down_for_two_seconds_is_not_force_deleted_as_if_the_node_were_gone() -> (
    None
):
    # 15 s in Terminating is past the lost-node deadline (10 s) but within a live kubelet's
    # (10 s plus the pod's grace): a blip of the node's Ready is no reason to force it.
    assert stuck_on(at(98)) == {}
    assert stuck_on(at(40)) == {"train-1-0-1": 0}
