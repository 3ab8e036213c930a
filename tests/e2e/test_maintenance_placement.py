"""Placement on the local cluster weighs GKE's scheduled host maintenance against the run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, training_job

from tpujob.api import labels

pytestmark = [pytest.mark.cluster, pytest.mark.usefixtures("operator", "healthy_nodes")]


def test_a_pool_with_maintenance_due_is_not_chosen_while_another_is_free(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    soon = str(int(time.time()) + 1800)
    due = [
        n.metadata.name
        for n in core.list_node().items
        if (n.metadata.labels or {}).get(labels.NODEPOOL) == "tpu-pool-0"
    ]
    assert due
    try:
        for name in due:
            core.patch_node(
                name,
                {"metadata": {"labels": {labels.SCHEDULED_MAINTENANCE_LABEL: soon}}},
                _content_type="application/merge-patch+json",
            )
        run = Run(cluster, namespace, operator, training_job("upkeep", tmp_path, steps=10))
        status = run.wait(
            lambda s: s.get("currentAttempt", {}).get("placement"), "a placement", timeout=60
        )
        assert status["currentAttempt"]["placement"][0]["nodePool"] != "tpu-pool-0"
        run.wait_phase("Succeeded")
    finally:
        for name in due:
            core.patch_node(
                name,
                {"metadata": {"labels": {labels.SCHEDULED_MAINTENANCE_LABEL: None}}},
                _content_type="application/merge-patch+json",
            )
