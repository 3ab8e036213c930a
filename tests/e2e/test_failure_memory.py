"""The job's memory on the local cluster: a failure that follows the job is the program's.

The same deterministic failure strikes slice 0 in attempt 1 and slice 1 in attempt 2: the
first is retried, the second ends the job fatal, with the recurrence as the evidence.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, training_job

pytestmark = [pytest.mark.cluster, pytest.mark.trainer,
              pytest.mark.usefixtures("operator", "healthy_nodes")]


def test_the_same_failure_on_two_slices_ends_the_job_fatal_after_the_second(
        cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path) -> None:
    # Exit 40 is the trainer's "checkpoint restore failed": retryable on its own. Worker 2 is
    # slice 1's first worker (two hosts per slice).
    faults = ("exit-code=40@5:worker=0:attempt=1", "exit-code=40@5:worker=2:attempt=2")
    run = Run(cluster, namespace, operator,
              training_job("twice", tmp_path, slices=2, steps=60, faults=faults))
    status = run.wait_phase("Failed")
    assert status["attempt"] == 2, status.get("timeline")
    assert status["restarts"]["medium"] == 1
    failure = status["lastFailure"]
    assert failure["class"] == "fatal"
    assert failure["pod"] == "twice-2-1-0"
    evidence = " ".join(failure.get("evidence", []))
    # The repeat guard (same failure, same trainer-reported step) or the memory (the same
    # failure on other nodes) says why: either way the recurrence is the evidence.
    assert re.search(r"previous failure CHECKPOINT_RESTORE_FAILED\S* at step \d+|seen 2 times",
                     evidence), failure
    assert any("FATAL" in m for m in run.events()), (run.events(), status.get("pendingEvents"))
