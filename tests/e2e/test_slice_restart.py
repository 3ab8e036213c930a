"""Restarts in place on the local cluster, with the real JAX trainer.

A slice restart: two slices, one worker's node lost. Only the failed slice's pods are replaced; the
healthy slice's pods stay (same uids, same nodes), their trainers restart in place as the new
attempt when the operator's rejoin order reaches them through the downward API, and all four
processes resume from the checkpoint. A hang: one slice, one worker hung; every trainer
restarts as the next attempt in the pod it ran in, and no pod is deleted or created. So does a
training process that died: its supervisor reports it on the heartbeat Lease and holds the pod;
and a trainer container killed whole, which its container restart rule starts again in its pod.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import (
    FAULTED_STEPS,
    Run,
    assert_recovered,
    resumed_from_checkpoint,
    training_job,
)

from tpujob.api import contract, labels

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


@pytest.mark.long
def test_a_node_lost_in_one_slice_replaces_that_slice_and_the_other_rejoins_in_place(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(
        cluster,
        namespace,
        operator,
        training_job("rejoin", tmp_path, slices=2, steps=FAULTED_STEPS),
    )
    before = run.wait_training(step=15)
    pools = {p["slice"]: p["nodePool"] for p in before["currentAttempt"]["placement"]}
    kept = {
        p.metadata.name: (p.metadata.uid, p.spec.node_name)
        for p in run.pods(1)
        if p.metadata.labels[labels.SLICE] == "0"
    }
    assert sorted(kept) == ["rejoin-1-0-0", "rejoin-1-0-1"]
    # A node lost: a SIGKILLed trainer container would restart in its pod, keeping every pod.
    cluster.tpujob("local", "fault", "node-down", run.node_of(1, 1, 0))
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    # Only the lost slice moves: slice 0 keeps its pool, slice 1 goes to another.
    after = {p["slice"]: p["nodePool"] for p in status["currentAttempt"]["placement"]}
    assert after[0] == pools[0] and after[1] != pools[1], (pools, after)
    assert [(k["slice"], k["podsAttempt"]) for k in status["currentAttempt"]["keptSlices"]] == [
        (0, 1)
    ]
    assert "slice 0 kept in place" in status["lastFailure"]["action"]
    now = {p.metadata.name: p for p in run.pods(2)}
    assert sorted(now) == ["rejoin-1-0-0", "rejoin-1-0-1", "rejoin-2-1-0", "rejoin-2-1-1"]
    for name, (uid, node) in kept.items():
        pod = now[name]
        assert (pod.metadata.uid, pod.spec.node_name) == (uid, node)  # the same pod
        order = contract.parse_rejoin(pod.metadata.annotations[contract.POD_REJOIN_ANNOTATION])
        assert order is not None and order.attempt == 2
        assert "rejoining as attempt 2" in run.core.read_namespaced_pod_log(name, namespace)
    resumed_from_checkpoint(run, before.get("checkpointStep"))


@pytest.mark.long
def test_a_hung_worker_restarts_every_trainer_in_its_own_pod(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    body = training_job(
        "inplace",
        tmp_path,
        steps=60,
        faults=("hang@18:worker=1:attempt=1",),
        stallTimeoutSeconds=15,
    )
    run = Run(cluster, namespace, operator, body)
    before = run.wait_training(step=12)
    pods = {p.metadata.name: (p.metadata.uid, p.spec.node_name) for p in run.pods(1)}
    assert sorted(pods) == ["inplace-1-0-0", "inplace-1-0-1"]
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    assert status["lastFailure"]["code"] == "HANG"
    assert "every trainer restarted in its pod" in status["lastFailure"]["action"]
    restarted_in_place(run, pods)
    resumed_from_checkpoint(run, before.get("checkpointStep"))


def restarted_in_place(run: Run, pods: dict[str, tuple[str, str]]) -> None:
    """Every one of `pods` (name -> uid, node) is the same pod on the same node, its container
    never restarted, and its trainer rejoined as attempt 2; no other pod exists."""
    now = {p.metadata.name: p for p in run.pods()}
    assert sorted(now) == sorted(pods)  # no pod created, none deleted
    for name, (uid, node) in pods.items():
        pod = now[name]
        assert (pod.metadata.uid, pod.spec.node_name) == (uid, node)
        assert pod.status.container_statuses[0].restart_count == 0
        order = contract.parse_rejoin(pod.metadata.annotations[contract.POD_REJOIN_ANNOTATION])
        assert order is not None and order.attempt == 2
        assert "rejoining as attempt 2" in run.core.read_namespaced_pod_log(name, run.namespace)


def test_a_training_process_that_died_restarts_in_its_own_pod(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    # The process kills itself (SIGKILL, as the kernel's OOM killer would); its supervisor,
    # the pod's main process, reports the end on the Lease and holds the pod.
    body = training_job("died", tmp_path, steps=60, faults=("crash@30:worker=1:attempt=1",))
    run = Run(cluster, namespace, operator, body)
    before = run.wait_training(step=12)
    pods = {p.metadata.name: (p.metadata.uid, p.spec.node_name) for p in run.pods(1)}
    assert sorted(pods) == ["died-1-0-0", "died-1-0-1"]
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    assert status["lastFailure"]["pod"] == "died-1-0-1"
    assert "every trainer restarted in its pod" in status["lastFailure"]["action"]
    restarted_in_place(run, pods)
    log = run.core.read_namespaced_pod_log("died-1-0-1", namespace)
    assert f"reported exit 137 on the Lease as {contract.failure_annotation(0, 1)}" in log
    resumed_from_checkpoint(run, before.get("checkpointStep"))


def test_a_trainer_container_killed_whole_restarts_in_its_own_pod(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    # The whole container is killed, the supervisor with its child, as an OOM kill on a cgroup
    # v2 node does: the container restart rule starts it again in its pod, and the supervisor,
    # finding in its state file the attempt it ran, reports the kill on the Lease and rejoins.
    body = training_job("ckill", tmp_path, steps=FAULTED_STEPS)
    run = Run(cluster, namespace, operator, body)
    before = run.wait_training(step=15)
    pods = {p.metadata.name: (p.metadata.uid, p.spec.node_name) for p in run.pods(1)}
    assert sorted(pods) == ["ckill-1-0-0", "ckill-1-0-1"]
    # The apiserver kept the rule (the ContainerRestartRules gate is on).
    rules = run.pods(1)[0].spec.containers[0].restart_policy_rules
    assert [(r.action, r.exit_codes.operator, r.exit_codes.values) for r in rules] == [
        ("Restart", "In", [137])
    ]
    cluster.tpujob("local", "fault", "kill", "ckill-1-0-1", "-n", namespace)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    assert status["lastFailure"]["pod"] == "ckill-1-0-1"
    assert status["lastFailure"]["code"] == "PROCESS_KILLED"
    assert "every trainer restarted in its pod" in status["lastFailure"]["action"]
    now = {p.metadata.name: p for p in run.pods()}
    assert sorted(now) == sorted(pods)  # no pod created, none deleted
    for name, (uid, node) in pods.items():
        pod = now[name]
        assert (pod.metadata.uid, pod.spec.node_name) == (uid, node)
        (container,) = pod.status.container_statuses
        assert container.restart_count == (1 if name == "ckill-1-0-1" else 0)
        order = contract.parse_rejoin(pod.metadata.annotations[contract.POD_REJOIN_ANNOTATION])
        assert order is not None and order.attempt == 2
        assert "rejoining as attempt 2" in run.core.read_namespaced_pod_log(name, namespace)
    killed = now["ckill-1-0-1"].status.container_statuses[0].last_state.terminated
    assert killed.exit_code == 137
    log = run.core.read_namespaced_pod_log("ckill-1-0-1", namespace)
    assert "the container was killed while it ran attempt 1" in log
    assert f"reported exit 137 on the Lease as {contract.failure_annotation(0, 1)}" in log
    resumed_from_checkpoint(run, before.get("checkpointStep"))
