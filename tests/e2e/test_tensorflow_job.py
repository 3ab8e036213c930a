"""A TensorFlow trainer job on the local cluster goes through a soft fault and finishes.

The job (`spec.framework: tensorflow`, nothing in its args) runs the reference trainer's
TensorFlow loop (Keras, CPU fallback allowed) on two hosts. One worker is killed with SIGKILL
while it trains; the operator must diagnose a soft failure from what the TensorFlow trainer
left behind, restart the attempt, and the new attempt must resume from the checkpoint
TensorFlow saved (as the heartbeat reported it) and train to the end.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import (
    Run,
    assert_recovered,
    resumed_from_checkpoint,
    training_job,
)

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]
STEPS = 100


def tensorflow_job(name: str, checkpoints: Path, *, steps: int) -> dict[str, Any]:
    body = training_job(name, checkpoints, steps=steps)
    # The spec alone picks the loop: the operator passes it to the trainer (TPUJOB_FRAMEWORK).
    body["spec"]["framework"] = "tensorflow"
    return body


def test_tensorflow_job_resumes_from_its_checkpoint_after_a_killed_worker(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, tensorflow_job("tf", tmp_path, steps=STEPS))
    before = run.wait_training(step=22)
    # Worker 0's heartbeat reports TensorFlow's committed checkpoint (saved every 10 steps).
    assert (before.get("checkpointStep") or 0) >= 10, before
    cluster.tpujob("local", "fault", "kill", "tf-1-0-1", "-n", namespace)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    failure = status["lastFailure"]
    assert (failure["class"], failure["pod"]) == ("soft", "tf-1-0-1"), failure
    assert any(m.startswith("[SOFT]") for m in run.events())
    resumed_from_checkpoint(run, before.get("checkpointStep"))
    assert (status["progress"]["step"], status["checkpointStep"]) == (STEPS, STEPS)
