"""Node faults as the local agent reads them and the node status it posts under them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpujob.local.agent import nodes
from tpujob.local.agent.agent import NodeFaults, fault_path, read_faults


def test_a_not_ready_node_posts_ready_false_since_the_flap_and_keeps_its_chips() -> None:
    node = nodes.plan_nodes(1, "tpu-v4-podslice", "2x2x2", spare_nodes=0)[0]
    status = nodes.node_status(
        node, now="t1", tpu_healthy=True, log_port=1, ready_since="t0", ready=False
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "KubeletNotReady")
    assert (ready["lastTransitionTime"], ready["lastHeartbeatTime"]) == ("t0", "t1")
    assert status["allocatable"][nodes.TPU_RESOURCE] == "4"


def test_faults_are_read_from_the_state_dir_and_missing_or_unknown_keys_are_ignored(
    tmp_path: Path,
) -> None:
    assert read_faults(tmp_path, "n") == NodeFaults()
    path = fault_path(tmp_path, "n")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kubelet_stopped": True, "from_a_newer_agent": True}))
    assert read_faults(tmp_path, "n") == NodeFaults(kubelet_stopped=True)
    path.write_text("{not json")
    assert read_faults(tmp_path, "n") == NodeFaults()


@pytest.mark.parametrize(
    ("faults", "silent"),
    [
        (NodeFaults(), False),
        (NodeFaults(down=True), True),
        (NodeFaults(kubelet_stopped=True), True),
        (NodeFaults(not_ready=True), False),
        (NodeFaults(tpu_unhealthy=True), False),
    ],
    ids=["healthy", "down", "kubelet-stopped", "not-ready", "tpu-unhealthy"],
)
def test_only_a_down_node_or_a_stopped_kubelet_is_silent(faults: NodeFaults, silent: bool) -> None:
    assert faults.silent is silent
