"""The node agent restarts a container as the kubelet does with ContainerRestartRules: a rule
matching the exit code restarts it, else the container's own restartPolicy, else the pod's; a
restarted container keeps its pod (phase Running), counts the restart and shows the end it
restarted from as lastState."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpujob.local.agent.restarts import (
    ContainerRestarts,
    RestartPolicy,
    RestartRule,
    RuleOperator,
    container_restarts,
    restarts,
)
from tpujob.local.agent.runtime import ContainerRuntime, PodRuntime, Terminated, pod_status

KILLED = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [137]}}]
NOT_OK = [{"action": "Restart", "exitCodes": {"operator": "NotIn", "values": [0, 42]}}]


@pytest.mark.parametrize(
    ("pod_policy", "container", "exit_code", "restarted"),
    [
        ("Never", {}, 137, False),
        ("Always", {}, 0, True),
        ("OnFailure", {}, 0, False),
        ("OnFailure", {}, 1, True),
        ("Never", {"restartPolicy": "Never", "restartPolicyRules": KILLED}, 137, True),
        ("Never", {"restartPolicy": "Never", "restartPolicyRules": KILLED}, 1, False),
        ("Never", {"restartPolicy": "Never", "restartPolicyRules": KILLED}, 0, False),
        ("Never", {"restartPolicy": "Never", "restartPolicyRules": KILLED}, 44, False),
        ("Never", {"restartPolicy": "Never", "restartPolicyRules": NOT_OK}, 3, True),
        ("Never", {"restartPolicy": "Never", "restartPolicyRules": NOT_OK}, 42, False),
        ("Never", {"restartPolicy": "Never", "restartPolicyRules": NOT_OK}, 0, False),
        ("Always", {"restartPolicy": "Never"}, 1, False),
        ("Never", {"restartPolicy": "OnFailure"}, 1, True),
        ("Never", {"restartPolicy": "Always"}, 0, True),
        ("Always", {"restartPolicy": "Never", "restartPolicyRules": KILLED}, 0, False),
        # Rules of an operator or action the API does not have match nothing.
        (
            "Never",
            {
                "restartPolicy": "Never",
                "restartPolicyRules": [
                    {"action": "Restart", "exitCodes": {"operator": "Gt", "values": [0]}},
                    {"action": "Ignore", "exitCodes": {"operator": "In", "values": [137]}},
                ],
            },
            137,
            False,
        ),
    ],
    ids=str,
)
def test_restart_follows_the_rules_then_the_containers_policy_then_the_pods(
    pod_policy: str, container: dict[str, Any], exit_code: int, restarted: bool
) -> None:
    assert restarts(pod_policy, container_restarts(container), exit_code) is restarted


def test_rules_are_read_from_the_container_spec() -> None:
    fields = container_restarts({"restartPolicy": "Never", "restartPolicyRules": KILLED + NOT_OK})
    assert fields == ContainerRestarts(
        RestartPolicy.NEVER,
        (
            RestartRule(RuleOperator.IN, frozenset({137})),
            RestartRule(RuleOperator.NOT_IN, frozenset({0, 42})),
        ),
    )


def killed_pod(tmp_path: Path, *, terminating: bool = False, node_lost: bool = False) -> PodRuntime:
    rt = PodRuntime(
        uid="u",
        namespace="ns",
        name="p",
        node="n",
        directory=tmp_path,
        ip="10.1.1.5",
        restart_policy="Never",
        started_at=100.0,
        netns="x",
        node_lost=node_lost,
        terminating_deadline=130.0 if terminating else None,
    )
    container = ContainerRuntime(
        name="trainer",
        image="img",
        directory=tmp_path / "containers" / "trainer",
        restart_fields=container_restarts({"restartPolicy": "Never", "restartPolicyRules": KILLED}),
    )
    container.terminated = Terminated(137, "Error", "", 100.0, 110.0, 9)
    rt.containers.append(container)
    return rt


def test_a_container_killed_under_a_rule_keeps_its_pod_running_with_the_end_as_last_state(
    tmp_path: Path,
) -> None:
    rt = killed_pod(tmp_path)
    assert rt.should_restart(rt.containers[0])
    status = pod_status(rt, {}, now=111.0)
    assert status["phase"] == "Running"
    container = status["containerStatuses"][0]
    assert container["lastState"]["terminated"]["exitCode"] == 137
    assert "waiting" in container["state"]


@pytest.mark.parametrize(
    ("terminating", "node_lost"), [(True, False), (False, True)], ids=["deleted", "node-lost"]
)
def test_no_rule_restarts_a_container_of_a_pod_going_away(
    tmp_path: Path, terminating: bool, node_lost: bool
) -> None:
    rt = killed_pod(tmp_path, terminating=terminating, node_lost=node_lost)
    assert not rt.should_restart(rt.containers[0])
    assert rt.phase() == "Failed"
