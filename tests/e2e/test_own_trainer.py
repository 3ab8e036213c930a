"""A user's own trainer on the local cluster: one that never writes the heartbeat is not hung.

A plain JAX script (no SDK, no heartbeat) trains for longer than any stall limit the job sets
(10 s) and longer than the start-up limit the operator once gave a silent trainer (60 s), and
finishes in its first attempt: silence is not a hang when the trainer never spoke.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, training_job

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]

SCRIPT = Path(__file__).parents[1] / "data" / "plain_jax_loop.py"
# Past the old limit for a trainer that never beat: max(2 x stallTimeoutSeconds, 60 s).
TRAIN_SECONDS = 75


def test_a_trainer_without_the_heartbeat_outlives_every_stall_limit_unrestarted(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    body = training_job("plain", tmp_path, stallTimeoutSeconds=10)
    body["spec"]["trainer"]["command"] = [sys.executable, str(SCRIPT)]
    body["spec"]["trainer"]["args"] = ["--seconds", str(TRAIN_SECONDS)]
    run = Run(cluster, namespace, operator, body)
    status = run.wait_phase("Succeeded")
    context = f"failure {status.get('lastFailure')}; timeline {status.get('timeline')}"
    assert status["attempt"] == 1, context
    assert status["restarts"]["total"] == 0, context
    assert "lastFailure" not in status, context
