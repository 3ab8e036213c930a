"""`helm install` into the local cluster: the node agent runs the operator's pod in-cluster under
the chart's ServiceAccount, and that operator takes a job through a hard failure. This proves
the chart's RBAC is enough; test_chart_render proves it is not more than listed.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from tests.e2e.conftest import CHART, LocalCluster, wait_for
from tests.e2e.test_operator_recovery import FAULTED_STEPS, Run, assert_recovered, training_job

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.usefixtures("healthy_nodes")]


def helm(cluster: LocalCluster, *args: str) -> str:
    proc = subprocess.run([str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig),
                           *args], capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@pytest.fixture
def installed(cluster: LocalCluster, core: client.CoreV1Api, crds_installed: None,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    suffix = uuid.uuid4().hex[:5]
    # The chart admits hostPath checkpoints only under the prefixes it is given.
    checkpoints = tmp_path_factory.mktemp("helm-checkpoints")
    system, jobs = f"helm-system-{suffix}", f"helm-jobs-{suffix}"
    core.create_namespace({"metadata": {"name": jobs}})
    wait_for(lambda: core.list_namespaced_service_account(jobs).items, timeout=30,
             what="default ServiceAccount")
    helm(cluster, "install", "tpujob", str(CHART), "--namespace", system, "--create-namespace",
         "--set", f"watchNamespaces={{{jobs}}}",
         "--set", f"hostPathPrefixes={{{checkpoints}}}",
         "--set", "operator.extraArgs={--collective-timeout=15,--force-delete-after=3,"
                  "--restart-grace=3}",
         "--wait", "--timeout", "120s")
    try:
        yield system, jobs, checkpoints
    finally:
        helm(cluster, "uninstall", "tpujob", "--namespace", system, "--wait")
        core.delete_namespace(jobs)
        core.delete_namespace(system)


def test_helm_installed_operator_recovers_a_hard_failure_in_cluster(
        cluster: LocalCluster, core: client.CoreV1Api,
        installed: tuple[str, str, Path]) -> None:
    system, jobs, checkpoints = installed
    operator_pod = core.list_namespaced_pod(system).items[0]
    assert operator_pod.spec.service_account_name.startswith("tpujob")
    assert operator_pod.status.phase == "Running"
    run = Run(cluster, jobs, None, training_job("inhelm", checkpoints, steps=FAULTED_STEPS))
    run.wait_training(step=15)
    cluster.tpujob("local", "fault", "node-down", run.node_of(1, 0, 1))
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    log = core.read_namespaced_pod_log(operator_pod.metadata.name, system)
    assert "Forbidden" not in log
    assert "[HARD] NODE_LOST" in log
