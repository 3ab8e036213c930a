"""Warm spares on the local cluster, with the real JAX trainer.

A job asking for one spare holds a free pool with idle pods while it trains; another job that
arrives later takes the last free pool, not the spare. A node of the first job goes down: its
slice moves to the spare at once (no pool was free), resumes from the checkpoint and finishes;
the job lets its spares go when it ends.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.e2e.conftest import LocalCluster, wait_for
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import (
    FAULTED_STEPS,
    Run,
    assert_recovered,
    resumed_from_checkpoint,
    timeline_kinds,
    training_job,
)

from tpujob.api import labels

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


def spare_pods(run: Run) -> list[tuple[str, str, str]]:
    """(name, pool, phase) of the job's idle spare pods."""
    return sorted(
        (p.metadata.name, p.spec.node_selector[labels.NODEPOOL], p.status.phase)
        for p in run.pods()
        if (p.metadata.labels or {}).get(labels.SPARE) == "true"
    )


@pytest.mark.long
def test_a_lost_node_moves_the_slice_to_the_jobs_warm_spare(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    body = training_job("spared", tmp_path / "spared", steps=FAULTED_STEPS)
    body["spec"]["tpu"]["spares"] = 1
    run = Run(cluster, namespace, operator, body)
    ready = run.wait(
        lambda s: (
            s.get("phase") == "Running" and [x.get("ready") for x in s.get("spares", [])] == [True]
        ),
        "one spare held and ready",
    )
    spare = ready["spares"][0]["nodePool"]
    placed = ready["currentAttempt"]["placement"][0]["nodePool"]
    assert spare != placed
    assert [(pool, phase) for _, pool, phase in spare_pods(run)] == [(spare, "Running")] * 2
    # A job that comes later takes the last free pool, never the spare.
    other = Run(cluster, namespace, operator, training_job("other", tmp_path / "other", steps=400))
    other_status = other.wait(
        lambda s: bool((s.get("currentAttempt") or {}).get("launchedTime")), "the other launched"
    )
    other_pool = other_status["currentAttempt"]["placement"][0]["nodePool"]
    assert other_pool not in (spare, placed)
    before = run.wait_training(step=22)
    node = run.node_of(1, 0, 1)
    cluster.tpujob("local", "fault", "node-down", node)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    assert status["lastFailure"]["code"] == "NODE_LOST"
    assert status["currentAttempt"]["placement"][0]["nodePool"] == spare
    assert "SpareUsed" in timeline_kinds(status)
    resumed_from_checkpoint(run, before.get("checkpointStep"))
    # Ended: every spare let go (none was free to refill meanwhile: the other job holds one
    # pool, and the lost node's pool is unusable).
    assert run.status().get("spares", []) == []
    wait_for(lambda: not spare_pods(run), timeout=60, what="the spare's idle pods gone")
    assert other.status()["currentAttempt"]["placement"][0]["nodePool"] == other_pool
