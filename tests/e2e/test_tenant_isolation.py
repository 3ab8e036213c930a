"""One tenant's recovery rule cannot slow the operator for the others.

Job A's rule `(a|aa)+$` backtracks catastrophically under a backtracking engine on a log of
`a`s; A's trainer prints 80 of them and fails, over and over. Job B, beside it, loses a worker:
its failure is diagnosed and restarted about as fast as without A, and the operator's liveness
endpoint answers throughout.
"""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import FAULTED_STEPS, Run, training_job

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]


def restart_seconds(status: dict[str, Any]) -> float:
    """From the failure seen to the restart decided, as the timeline records them."""
    times = {
        e["kind"]: datetime.fromisoformat(e["time"].replace("Z", "+00:00"))
        for e in status["timeline"]
        if e["kind"] in ("FailureSeen", "Restarting")
    }
    return (times["Restarting"] - times["FailureSeen"]).total_seconds()


def soft_fault(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, name: str, checkpoints: Path
) -> float:
    run = Run(cluster, namespace, operator, training_job(name, checkpoints, steps=FAULTED_STEPS))
    run.wait_training(step=10)
    cluster.tpujob("local", "fault", "kill", f"{name}-1-0-1", "-n", namespace)
    status = run.wait(lambda s: s.get("restarts", {}).get("soft") == 1, "the soft restart")
    return restart_seconds(status)


def test_a_backtracking_user_rule_does_not_slow_other_jobs_or_the_operator(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    alone = soft_fault(cluster, namespace, operator, "alone", tmp_path / "alone")
    evil = training_job("evil", tmp_path / "evil", steps=FAULTED_STEPS)
    evil["spec"]["trainer"]["command"] = ["sh", "-c", "printf 'a%.0s' $(seq 80); echo; exit 1"]
    evil["spec"]["trainer"]["args"] = []
    evil["spec"]["recovery"]["rules"] = [{"messagePattern": "(a|aa)+$", "class": "soft"}]
    a = Run(cluster, namespace, operator, evil)
    a.wait(lambda s: s.get("restarts", {}).get("soft", 0) >= 1, "job A failing and restarting")
    probes: list[bool] = []
    stop = threading.Event()

    def probe() -> None:
        while not stop.is_set():
            probes.append(operator.healthy())
            stop.wait(1.0)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        beside = soft_fault(cluster, namespace, operator, "beside", tmp_path / "beside")
    finally:
        stop.set()
        prober.join()
    assert beside <= 2 * max(alone, 1.0), (alone, beside)
    assert probes and all(probes), probes
    failure = a.status()["lastFailure"]
    told = " ".join([failure["summary"], *failure.get("chain", [])])
    assert "spec.recovery.rules[0]" in told, failure  # A's rule graded A's failures
