"""Marking a node and taking the mark off: only the mark the job made, only as the Node reads
now (the patch carries its resourceVersion; taints are one list, written whole)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpujob.api import BadNodeAction, labels
from tpujob.kube.apply import ApiWriter
from tpujob.kube.errors import ConflictError
from tpujob.plan.result import NodeMark

OURS = "team/train: NODE_LOST"
UNREACHABLE = client.V1Taint(key=labels.UNREACHABLE_TAINT, effect="NoExecute")


class FakeNodes:
    """The two CoreV1Api calls a mark makes, over one stored Node."""

    def __init__(self, node: client.V1Node, conflict: bool = False) -> None:
        self.node, self.conflict = node, conflict
        self.patches: list[dict[str, Any]] = []

    def read_node(self, name: str, **_: Any) -> client.V1Node:
        return self.node

    def patch_node(self, name: str, body: dict[str, Any], **_: Any) -> None:
        if self.conflict:
            raise ApiException(status=409, reason="Conflict")
        self.patches.append(body)


def marked_node(reason: str | None, *, cordoned: bool = False) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(
            name="n",
            resource_version="42",
            annotations={labels.BAD_NODE_REASON: reason} if reason else None,
        ),
        spec=client.V1NodeSpec(
            unschedulable=cordoned or None,
            taints=[
                client.V1Taint(key=labels.BAD_NODE_TAINT, value="train", effect="NoSchedule"),
                client.V1Taint(key="dedicated", value="tpu", effect="NoSchedule"),
            ],
        ),
    )


def cleared(nodes: FakeNodes, action: BadNodeAction) -> list[dict[str, Any]]:
    writer = ApiWriter(client.ApiClient())
    writer.core = nodes  # type: ignore[assignment]
    writer.mark_node(NodeMark("n", action, OURS, clear=True), "train")
    return nodes.patches


def test_the_jobs_own_taint_comes_off_and_other_taints_stay() -> None:
    [patch] = cleared(FakeNodes(marked_node(OURS)), BadNodeAction.TAINT)
    assert patch["metadata"] == {
        "resourceVersion": "42",
        "annotations": {labels.BAD_NODE_REASON: None},
    }
    assert patch["spec"] == {
        "taints": [{"key": "dedicated", "value": "tpu", "effect": "NoSchedule"}]
    }


def test_the_jobs_own_cordon_comes_off() -> None:
    [patch] = cleared(FakeNodes(marked_node(OURS, cordoned=True)), BadNodeAction.CORDON)
    assert patch["spec"] == {"unschedulable": False}


@pytest.mark.parametrize(
    "reason", ["other/job: NODE_LOST", "team/train: TPU_UNHEALTHY", None], ids=str
)
def test_a_mark_someone_else_made_stays(reason: str | None) -> None:
    assert cleared(FakeNodes(marked_node(reason)), BadNodeAction.TAINT) == []


def test_a_node_changed_in_between_is_left_for_the_next_reconcile() -> None:
    # The Conflict of the resourceVersion-guarded patch is not an error of the reconcile.
    assert cleared(FakeNodes(marked_node(OURS), conflict=True), BadNodeAction.TAINT) == []


class ChangingNodes(FakeNodes):
    """A Node someone else taints between the operator's first read and its patch."""

    def __init__(self) -> None:
        super().__init__(unmarked_node("42", []))
        self.reads = 0

    def read_node(self, name: str, **_: Any) -> client.V1Node:
        self.reads += 1
        if self.reads == 1:
            return unmarked_node("42", [])
        return unmarked_node("43", [UNREACHABLE])

    def patch_node(self, name: str, body: dict[str, Any], **_: Any) -> None:
        if body["metadata"]["resourceVersion"] != "43":
            raise ApiException(status=409, reason="Conflict")
        self.patches.append(body)


def unmarked_node(version: str, taints: list[client.V1Taint]) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name="n", resource_version=version),
        spec=client.V1NodeSpec(taints=taints or None),
    )


def marked(nodes: FakeNodes) -> list[dict[str, Any]]:
    writer = ApiWriter(client.ApiClient())
    writer.core = nodes  # type: ignore[assignment]
    writer.mark_node(NodeMark("n", BadNodeAction.TAINT, OURS), "train")
    return nodes.patches


def test_a_taint_added_between_read_and_patch_is_kept_by_reading_the_node_again() -> None:
    nodes = ChangingNodes()
    [patch] = marked(nodes)
    assert nodes.reads == 2
    assert patch["metadata"]["resourceVersion"] == "43"
    keys = [t["key"] for t in patch["spec"]["taints"]]
    assert keys == [labels.UNREACHABLE_TAINT, labels.BAD_NODE_TAINT]


def test_a_node_that_keeps_changing_fails_the_mark_for_the_next_reconcile() -> None:
    with pytest.raises(ConflictError):
        marked(FakeNodes(unmarked_node("42", []), conflict=True))
