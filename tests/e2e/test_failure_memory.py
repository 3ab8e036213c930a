"""The job's memory on the local cluster: where a failure recurs says what is broken.

The same deterministic failure strikes slice 0 in attempt 1 and slice 1 in attempt 2: the
first is retried, the second ends the job fatal, with the recurrence as the evidence. A
worker crashing on one node in attempt 1 and again on that node in attempt 2 is the node: the
slice moves to another pool and the job trains to the end there; the node is this job's failed
node, not tainted for the others (one job's own failures never mark a node), unless the job's
namespace is one the operator trusts with its history (`--trust-job-history`): then the node is
tainted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, wait_for
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, training_job

from tpujob.api import labels

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


def test_the_same_failure_on_two_slices_ends_the_job_fatal_after_the_second(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    # Exit 40 is the trainer's "checkpoint restore failed": retryable on its own. Worker 2 is
    # slice 1's first worker (two hosts per slice).
    faults = ("exit-code=40@5:worker=0:attempt=1", "exit-code=40@5:worker=2:attempt=2")
    run = Run(
        cluster,
        namespace,
        operator,
        training_job("twice", tmp_path, slices=2, steps=60, faults=faults),
    )
    status = run.wait_phase("Failed")
    context = (
        f"last failure {status.get('lastFailure')}; history {status.get('failureHistory')};"
        f" timeline {status.get('timeline')}"
    )
    assert status["attempt"] == 2, context
    assert status["restarts"]["medium"] == 1
    failure = status["lastFailure"]
    assert failure["class"] == "fatal"
    assert failure["pod"] == "twice-2-1-0"
    evidence = " ".join(failure.get("evidence", []))
    # The repeat guard (same failure, same trainer-reported step) or the memory (the same
    # failure on other nodes) says why: either way the recurrence is the evidence.
    assert re.search(
        r"previous failure CHECKPOINT_RESTORE_FAILED\S* at step \d+|seen 2 times", evidence
    ), failure
    run.told(lambda m: "FATAL" in m)


def repeat_on_one_node(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> tuple[dict[str, Any], str, Run]:
    """A job whose worker crashes on one node twice, trained to the end elsewhere; checks what
    holds wherever the namespace is, returns the final status and the node."""
    # A worker on one node dies of SIGSEGV (a host's memory errors look like this) mid-training,
    # and again as attempt 2 starts on that node, before it trains past the step attempt 1
    # reached. A restart keeps the slice's pool, not each worker's node (the scheduler may swap
    # the two workers between the pool's two nodes), so the fault follows the node: whichever
    # worker attempt 2 runs there is the one that crashes.
    run = Run(
        cluster, namespace, operator, training_job("samenode", tmp_path, steps=100, step_time=0.2)
    )
    before = run.wait_training(step=22)
    node = run.node_of(1, 0, 1)
    pool = before["currentAttempt"]["placement"][0]["nodePool"]
    cluster.tpujob("local", "fault", "kill", "samenode-1-0-1", "-n", namespace, "--signal", "SEGV")

    def crashed_on_node() -> bool:
        # The first attempt 2 worker running there; its process may not exist for a moment.
        pod = next(
            (
                p.metadata.name
                for p in run.pods(2)
                if p.spec.node_name == node and p.status.phase == "Running"
            ),
            None,
        )
        return (
            pod is not None
            and cluster.tpujob(
                "local", "fault", "kill", pod, "-n", namespace, "--signal", "SEGV", check=False
            ).returncode
            == 0
        )

    wait_for(crashed_on_node, timeout=180, what=f"an attempt 2 worker on {node} crashed")
    status = run.wait_phase("Succeeded")
    history = status["failureHistory"]
    context = f"history {history}; timeline {status.get('timeline')}"
    assert status["attempt"] == 3, context
    # The same node, the same failure: the memory saw a repeat where the restart put it.
    assert [(r["attempt"], r["node"]) for r in history] == [(1, node), (2, node)], context
    assert history[0]["memorySignature"] == history[1]["memorySignature"], context
    created = [e["message"] for e in status["timeline"] if e["kind"] == "PodsCreated"]
    assert f"attempt 2: slice 0 on {pool}" in created, context  # the restart kept the pool
    assert history[0]["class"] in ("soft", "medium"), context
    assert history[1]["class"] == "hard", context
    restarts = status["restarts"]
    assert restarts["soft"] + restarts["medium"] == 1 and restarts["hard"] == 1, context
    failure = status["lastFailure"]
    assert (failure["class"], failure["node"]) == ("hard", node), failure
    assert any(f"seen 2 times in a row on node {node}" in e for e in failure["evidence"]), failure
    assert status["currentAttempt"]["placement"][0]["nodePool"] != pool, context
    assert status["progress"]["step"] == 100
    assert any(m.startswith("[HARD]") and node in m for m in run.events()), run.events()
    return status, node, run


def tpujob_taint(core: client.CoreV1Api, node: str) -> str | None:
    return next(
        (t.value for t in core.read_node(node).spec.taints or [] if t.key == labels.BAD_NODE_TAINT),
        None,
    )


def test_a_failure_that_repeats_on_one_node_moves_the_slice_off_it_without_a_taint(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    status, node, _ = repeat_on_one_node(cluster, namespace, operator, tmp_path)
    assert [(n["name"], n.get("jobOnly")) for n in status["failedNodes"]] == [(node, True)]
    # One job's own failures cannot get a node tainted for everyone (a job's author controls
    # how its program fails); the cross-namespace ledger can.
    assert tpujob_taint(core, node) is None


def test_trusted_namespace_a_failure_that_repeats_on_one_node_taints_it(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    # This namespace (test-trusted-...) is one the operator trusts with its jobs' history
    # (`--trust-job-history`, chart value nodeBlame.trustedNamespaces): the node is marked bad.
    assert namespace.startswith("test-trusted-")
    status, node, run = repeat_on_one_node(cluster, namespace, operator, tmp_path)
    assert [(n["name"], n.get("jobOnly"), n.get("marked")) for n in status["failedNodes"]] == [
        (node, None, True)
    ], status["failedNodes"]
    assert tpujob_taint(core, node) is not None
    assert any("marked bad" in m and node in m for m in run.events()), run.events()
