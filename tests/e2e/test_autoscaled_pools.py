"""spec.tpu.provisioning Autoscale on the local cluster (real scheduler): a job created while no
pool can take it creates its pods anyway, pinned to no pool, as the demand an autoscaler acts
on; when a pool appears (here: its nodes are uncordoned) the real scheduler puts the whole
slice into that one pool, the operator records it, and the job trains to the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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


def tpu_nodes(core: client.CoreV1Api) -> dict[str, str]:
    """Node name -> pool of every TPU node of the jobs' shape."""
    return {
        n.metadata.name: n.metadata.labels[labels.NODEPOOL]
        for n in core.list_node().items
        if n.metadata.labels.get(labels.ACCELERATOR) == "tpu-v4-podslice"
    }


def cordon(core: client.CoreV1Api, nodes: list[str], off: bool) -> None:
    for name in nodes:
        core.patch_node(name, {"spec": {"unschedulable": off}})


@pytest.fixture
def no_free_pool(core: client.CoreV1Api) -> Iterator[dict[str, str]]:
    nodes = tpu_nodes(core)
    cordon(core, list(nodes), True)
    try:
        yield nodes
    finally:
        cordon(core, list(nodes), False)


def test_an_autoscale_job_waits_in_pending_pods_and_runs_in_the_pool_that_appears(
    cluster: LocalCluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    no_free_pool: dict[str, str],
) -> None:
    body = training_job("grow", tmp_path, steps=30)
    body["spec"]["tpu"]["provisioning"] = "Autoscale"
    run = Run(cluster, namespace, operator, body)
    waiting = run.wait(
        lambda s: any(
            c["type"] == "Running" and c.get("reason") == "Provisioning"
            for c in s.get("conditions", [])
        ),
        "Running=False, Provisioning",
    )
    assert waiting["currentAttempt"].get("placement", []) == [], waiting
    # The status that says so is written before the pods are created.
    pods = wait_for(
        lambda: [p for p in [run.pods(attempt=1)] if len(p) == 2],
        timeout=60,
        what="the attempt's two pods",
    )[0]
    assert all(labels.NODEPOOL not in (p.spec.node_selector or {}) for p in pods)
    assert all(p.spec.node_name is None for p in pods)

    pool = sorted(set(no_free_pool.values()))[-1]
    cordon(run.core, [n for n, p in no_free_pool.items() if p == pool], False)
    status = run.wait_phase("Succeeded")
    assert status["restarts"]["total"] == 0, status.get("lastFailure")
    assert status["currentAttempt"]["placement"] == [{"slice": 0, "nodePool": pool}]
    landed = {no_free_pool[p.spec.node_name] for p in run.pods(attempt=1)}
    assert landed == {pool}
