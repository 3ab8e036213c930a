"""Elastic jobs on the local cluster, with the real JAX trainer: fewer slices, then all again.

A two-slice job with `elastic.minSlices: 1` on three pools, the third taken by another job. A
node of slice 1's pool goes down: no usable pool is left for slice 1, so the next attempt
trains on one slice (two processes instead of four) from the checkpoint instead of waiting. The
other job is deleted: the job grows back to two slices, again from the checkpoint, and
finishes. One hard restart in all; no attempt resumes before a step already
committed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, timeline_kinds, training_job

from tpujob.api import GROUP, PLURAL, VERSION, contract

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


@pytest.mark.long
def test_an_elastic_job_trains_on_fewer_slices_while_no_pool_is_free_and_grows_back(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    body = training_job("elastic", tmp_path, slices=2, steps=300, step_time=0.3)
    body["spec"]["elastic"] = {"minSlices": 1}
    run = Run(cluster, namespace, operator, body)
    run.wait_training(step=15)
    # Another job takes the third pool: no pool is left free.
    (tmp_path / "other").mkdir()
    other = Run(
        cluster,
        namespace,
        operator,
        training_job("other", tmp_path / "other", steps=5000, step_time=0.5),
    )
    other.wait_training(step=1)
    cluster.tpujob("local", "fault", "node-down", run.node_of(1, 1, 0))
    smaller = run.wait(
        lambda s: (
            s.get("attempt") == 2
            and s.get("phase") == "Running"
            and (s.get("currentAttempt") or {}).get("resumedStep") is not None
        ),
        "attempt 2 training on one slice",
    )
    assert smaller["currentAttempt"]["slices"] == 1, smaller.get("timeline")
    pods = run.pods(2)
    assert sorted(p.metadata.name for p in pods) == ["elastic-2-0-0", "elastic-2-0-1"]
    env = env_of(pods[0])
    assert (env["MEGASCALE_NUM_SLICES"], env["JAX_NUM_PROCESSES"]) == ("1", "2")
    assert env[contract.ENV_PLANNED_SLICES] == "2"
    resumed_smaller = smaller["currentAttempt"]["resumedStep"]
    run.wait(
        lambda s: (s.get("progress") or {}).get("step", 0) >= resumed_smaller + 10,
        "attempt 2 training on",
    )
    # The other job goes, and its pool with it.
    other.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "other")
    grown = run.wait(
        lambda s: s.get("attempt") == 3 and s.get("phase") == "Running",
        "attempt 3 running on both slices",
    )
    assert grown["currentAttempt"].get("slices") is None
    assert len(run.pods(3)) == 4
    status = run.wait_phase("Succeeded")
    context = f"timeline {status.get('timeline')}"
    assert status["restarts"]["hard"] == 1 and status["restarts"]["total"] == 1, context
    kinds = timeline_kinds(status)
    assert kinds.index("Degraded") < kinds.index("Resized"), context
    assert status["goodputBreakdown"]["degraded"] > 0
    # Each attempt resumed at or after the newest step committed when the one before ended.
    history = {r["attempt"]: r for r in status["attemptHistory"]}
    assert history[2]["slices"] == 1
    assert history[2]["firstStep"] >= history[1]["checkpointStep"], history
    assert status["currentAttempt"]["resumedStep"] >= history[2]["checkpointStep"], history
