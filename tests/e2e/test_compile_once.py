"""Compile once: a worker killed on the local cluster, and the new attempt's coordinator (its
trainer restarted in its pod) loads the training step from the job's JAX compilation cache (in
its checkpoint folder) instead of compiling it again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import FAULTED_STEPS, Run, assert_recovered, training_job

from tpujob.api import contract

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]

SUMMARY = re.compile(r"compilation cache (\S+): (\d+) hits")


def cache_hits(run: Run, pod: str) -> list[tuple[str, int]]:
    """The cache lines `pod` logged, one per training process it ran."""
    found = SUMMARY.findall(run.core.read_namespaced_pod_log(pod, run.namespace))
    assert found, f"{pod} logged no compilation cache line"
    return [(path, int(hits)) for path, hits in found]


def test_a_restarted_worker_loads_the_compiled_step_from_the_jobs_cache(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    body = training_job("compile", tmp_path, steps=FAULTED_STEPS)
    # The reference model compiles in well under JAX's default floor of one second.
    body["spec"]["trainer"]["env"] = [
        {"name": "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "value": "0"}
    ]
    run = Run(cluster, namespace, operator, body)
    run.wait_training(step=15)
    folder = f"/checkpoints/{contract.COMPILATION_CACHE_FOLDER}"
    assert cache_hits(run, "compile-1-0-0") == [(folder, 0)]
    assert any((tmp_path / contract.COMPILATION_CACHE_FOLDER).iterdir())
    cluster.tpujob("local", "fault", "kill", "compile-1-0-1", "-n", namespace)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    first, (path, hits) = cache_hits(run, "compile-1-0-0")
    assert first == (folder, 0) and path == folder and hits > 0
