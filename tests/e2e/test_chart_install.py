"""`helm install` into the local cluster: the node agent runs the operator's pod in-cluster under
the chart's ServiceAccount, and that operator takes a job through a hard failure. This proves
the chart's RBAC is enough; test_chart_render proves it is not more than listed. A rolling
`helm upgrade` of two replicas to a new image tag hands a training job over without a restart.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import CHART, LocalCluster, create_namespace, delete_namespace, wait_for
from tests.e2e.test_operator_recovery import FAULTED_STEPS, Run, assert_recovered, training_job

from tpujob.api import GROUP, PLURAL, VERSION, labels

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.usefixtures("healthy_nodes")]


def helm(cluster: LocalCluster, *args: str) -> str:
    proc = subprocess.run(
        [str(cluster.bin_dir / "helm"), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
    return proc.stdout


@contextlib.contextmanager
def _installed(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    tmp_path_factory: pytest.TempPathFactory,
    *values: str,
) -> Iterator[tuple[str, str, Path]]:
    suffix = uuid.uuid4().hex[:5]
    # The chart admits hostPath checkpoints only under the prefixes it is given.
    checkpoints = tmp_path_factory.mktemp("helm-checkpoints")
    system, jobs = f"helm-system-{suffix}", f"helm-jobs-{suffix}"
    create_namespace(core, jobs)
    sets = [
        f"watchNamespaces={{{jobs}}}",
        f"hostPathPrefixes={{{checkpoints}}}",
        "operator.extraArgs={--collective-timeout=15,--force-delete-after=3,--restart-grace=3}",
        *values,
    ]
    helm(
        cluster,
        "install",
        "tpujob",
        str(CHART),
        "--namespace",
        system,
        "--create-namespace",
        *(a for v in sets for a in ("--set", v)),
        "--wait",
        "--timeout",
        "120s",
    )
    try:
        yield system, jobs, checkpoints
    finally:
        delete_namespace(core, jobs)  # while the operator that removes their finalizers runs
        helm(cluster, "uninstall", "tpujob", "--namespace", system, "--wait", "--ignore-not-found")
        core.delete_namespace(system)


@pytest.fixture
def installed(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, Path]]:
    with _installed(cluster, core, tmp_path_factory) as where:
        yield where


@pytest.fixture
def two_replicas(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, str, Path]]:
    with _installed(cluster, core, tmp_path_factory, "replicas=2") as where:
        yield where


def _operator_pods(core: client.CoreV1Api, system: str) -> list[Any]:
    return [
        p
        for p in core.list_namespaced_pod(system).items
        if p.metadata.deletion_timestamp is None and p.status.phase == "Running"
    ]


def test_helm_installed_operator_recovers_a_hard_failure_in_cluster(
    cluster: LocalCluster, core: client.CoreV1Api, installed: tuple[str, str, Path]
) -> None:
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


def test_helm_uninstall_stops_the_operator_and_leaves_jobs_running_but_deletable(
    cluster: LocalCluster, core: client.CoreV1Api, installed: tuple[str, str, Path]
) -> None:
    """Without the pre-delete hook, the job below keeps the operator's finalizer after the
    uninstall, and its deletion waits for ever."""
    system, jobs, checkpoints = installed
    run = Run(cluster, jobs, None, training_job("orphan", checkpoints, steps=UPGRADE_STEPS))
    run.wait_training(step=5)
    pods = {p.metadata.uid for p in run.pods(1)}
    out = helm(cluster, "uninstall", "tpujob", "--namespace", system, "--wait", "--timeout", "240s")
    assert "uninstalled" in out
    assert not _operator_pods(core, system)
    body = run.custom.get_namespaced_custom_object(GROUP, VERSION, jobs, PLURAL, "orphan")
    assert labels.FINALIZER not in (body["metadata"].get("finalizers") or [])
    # Training was not stopped by the uninstall.
    assert pods <= {p.metadata.uid for p in run.pods(1) if p.status.phase == "Running"}
    run.custom.delete_namespaced_custom_object(GROUP, VERSION, jobs, PLURAL, "orphan")
    wait_for(
        lambda: not run.custom.list_namespaced_custom_object(GROUP, VERSION, jobs, PLURAL)["items"],
        timeout=30,
        what="the job deleted without an operator",
    )


# Long enough that the job still trains when a rolling upgrade of two replicas has finished.
UPGRADE_STEPS = 600


@pytest.mark.long
def test_helm_upgrade_of_two_replicas_to_a_new_tag_leaves_a_training_job_untouched(
    cluster: LocalCluster, core: client.CoreV1Api, two_replicas: tuple[str, str, Path]
) -> None:
    system, jobs, checkpoints = two_replicas
    before = {p.metadata.name for p in _operator_pods(core, system)}
    assert len(before) == 2
    run = Run(cluster, jobs, None, training_job("upgraded", checkpoints, steps=UPGRADE_STEPS))
    run.wait_training(step=15)
    helm(
        cluster,
        "upgrade",
        "tpujob",
        str(CHART),
        "--namespace",
        system,
        "--reuse-values",
        "--set",
        "image.tag=next",
        "--wait",
        "--timeout",
        "240s",
    )
    wait_for(
        lambda: not before & {p.metadata.name for p in core.list_namespaced_pod(system).items},
        timeout=120,
        what="the old replicas gone",
    )
    after = _operator_pods(core, system)
    assert len(after) == 2
    assert all(p.spec.containers[0].image.endswith(":next") for p in after)
    during = run.status()
    # Still training once the new replicas took over, so what follows is their doing.
    assert during["phase"] == "Running", during
    status = run.wait_phase("Succeeded")
    context = f"restarts {status.get('restarts')}; last failure {status.get('lastFailure')}"
    assert status["attempt"] == 1, context
    assert status["restarts"]["total"] == 0, context
    assert status["progress"]["step"] == UPGRADE_STEPS
    assert {p.metadata.labels[labels.ATTEMPT] for p in run.pods()} == {"1"}
