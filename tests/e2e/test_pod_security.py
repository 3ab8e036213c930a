"""Trainer pods against the apiserver's own Pod Security admission, the chart's hostPath policy,
and a restricted job checkpointing to a PersistentVolumeClaim on the local node.

The pods are the manifests the operator would create (`tpujob.plan.manifests`); admission is judged
by server-side dry-run, so nothing runs except in the claim test, where the node agent runs the
pod for real.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.e2e.conftest import LocalCluster, helm_template, wait_for, wait_host_paths_admitted
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import (
    Run,
    assert_recovered,
    resumed_from_checkpoint,
    training_job,
)
from tests.unit.plan.test_manifests_security import HOSTPATH_CASES

from tpujob.api import GROUP, PLURAL, VERSION, parse_job
from tpujob.plan import manifests, pod_security

pytestmark = pytest.mark.cluster

ALLOWED_PREFIX = "/var/tmp/tpujob"


def job_body(
    name: str,
    *,
    security: dict[str, Any] | None = None,
    volume: dict[str, Any] | None = None,
    command: list[str] | None = None,
) -> dict[str, Any]:
    trainer: dict[str, Any] = {
        "image": "local",
        "command": command or ["tpujob-trainer"],
        "allowCpuFallback": True,
        "serviceAccountName": "default",
    }
    if security is not None:
        trainer["security"] = security
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "tpu": {"accelerator": "tpu-v4-podslice", "topology": "2x2x2"},
            "trainer": trainer,
            "checkpoint": {"volume": volume or {"claimName": "checkpoints"}},
            "recovery": {"maxFailedNodes": 1},
        },
    }


def trainer_pod(namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    job = parse_job(
        {**body, "metadata": {**body["metadata"], "namespace": namespace, "uid": str(uuid.uuid4())}}
    )
    pod = manifests.trainer_pod(job, manifests.AttemptSettings(attempt=1, pools={}), 0, 0)
    # No job object exists to own the pod; the garbage collector would delete it at once.
    del pod["metadata"]["ownerReferences"]
    return pod


@pytest.fixture
def restricted(core: client.CoreV1Api, namespace: str) -> str:
    core.patch_namespace(
        namespace,
        {
            "metadata": {
                "labels": {
                    "pod-security.kubernetes.io/enforce": "restricted",
                    "pod-security.kubernetes.io/enforce-version": "latest",
                }
            }
        },
    )
    return namespace


def test_trainer_pod_the_operator_creates_is_admitted_in_a_restricted_namespace(
    core: client.CoreV1Api, restricted: str
) -> None:
    pod = trainer_pod(restricted, job_body("admitted"))
    created = core.create_namespaced_pod(restricted, pod, dry_run="All")
    assert created.spec.security_context.run_as_non_root is True


@pytest.mark.parametrize(
    ("security", "refusal"),
    [
        ({"allowRoot": True, "runAsUser": 0}, "runAsNonRoot != true"),
        ({"addCapabilities": ["SYS_ADMIN"]}, "unrestricted capabilities"),
        ({"seccompProfile": "Unconfined"}, "seccompProfile"),
    ],
    ids=["root", "sys-admin", "unconfined"],
)
def test_a_relaxed_trainer_is_still_judged_by_the_namespace(
    core: client.CoreV1Api, restricted: str, security: dict[str, Any], refusal: str
) -> None:
    pod = trainer_pod(restricted, job_body("relaxed", security=security))
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(restricted, pod, dry_run="All")
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message
    assert refusal in message


def host_path_policy_manifests(cluster: LocalCluster, namespace: str) -> str:
    """The chart's hostPath policy allowing ALLOWED_PREFIX, bound to `namespace`, rendered."""
    return helm_template(
        cluster,
        f"hp-{namespace[-5:]}",
        "tpujob-system",
        f"hostPathPrefixes={{{ALLOWED_PREFIX}/}}",
        f"watchNamespaces={{{namespace}}}",
        only=("templates/admission-policies.yaml",),
    )


@pytest.fixture
def host_path_policy(cluster: LocalCluster, crds_installed: None, namespace: str) -> Iterator[str]:
    """The chart's hostPath policy allowing ALLOWED_PREFIX, bound to this test's namespace."""
    rendered = host_path_policy_manifests(cluster, namespace)
    cluster.kubectl("apply", "-f", "-", input_text=rendered)
    try:
        yield namespace
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input_text=rendered, check=False)
        wait_host_paths_admitted(cluster)


def dry_run_job(cluster: LocalCluster, namespace: str, host_path: str) -> str | None:
    """None when a job with this checkpoint hostPath is admitted, else the refusal."""
    custom = client.CustomObjectsApi(cluster.api_client())
    body = job_body("hp", volume={"hostPath": host_path})
    try:
        custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All"
        )
    except ApiException as err:
        return str(json.loads(err.body)["message"])
    return None


def test_a_job_asking_for_host_path_root_is_refused_naming_the_setting(
    cluster: LocalCluster, host_path_policy: str
) -> None:
    # The policy takes effect once the apiserver has loaded it; poll the refusal.
    refusal = wait_for(
        lambda: dry_run_job(cluster, host_path_policy, "/"),
        timeout=30,
        what="the hostPath policy to refuse /",
    )
    assert pod_security.HOSTPATH_SETTING in refusal
    assert "spec.checkpoint.volume.hostPath / is not under a prefix" in refusal
    assert dry_run_job(cluster, host_path_policy, f"{ALLOWED_PREFIX}/job-a") is None


# The Python rule's table, where the CRD's own schema lets the path through to the policy.
POLICY_CASES = [
    (path, allowed)
    for path, prefixes, allowed in HOSTPATH_CASES
    if prefixes == [ALLOWED_PREFIX] and path.startswith("/")
]


def test_the_policy_and_hostpath_allowed_agree(
    cluster: LocalCluster, host_path_policy: str
) -> None:
    wait_for(
        lambda: dry_run_job(cluster, host_path_policy, "/"),
        timeout=30,
        what="the hostPath policy to refuse /",
    )
    verdicts = {
        path: dry_run_job(cluster, host_path_policy, path) is None for path, _ in POLICY_CASES
    }
    assert verdicts == {
        path: pod_security.hostpath_allowed(path, [ALLOWED_PREFIX]) for path, _ in POLICY_CASES
    }
    assert verdicts == dict(POLICY_CASES)


def test_a_job_admitted_before_the_prefixes_narrowed_can_still_be_deleted_not_resumed(
    cluster: LocalCluster, crds_installed: None, namespace: str
) -> None:
    """The policy judges a new spec only: the operator's finalizer removal (a metadata change)
    must go through when a job's hostPath is no longer allowed, or the job is undeletable."""
    custom = client.CustomObjectsApi(cluster.api_client())
    body = job_body("old", volume={"hostPath": "/elsewhere/ckpt"})
    body["spec"]["suspend"] = True  # stored, never launched
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    rendered = host_path_policy_manifests(cluster, namespace)
    cluster.kubectl("apply", "-f", "-", input_text=rendered)
    try:
        wait_for(
            lambda: dry_run_job(cluster, namespace, "/"),
            timeout=30,
            what="the hostPath policy to refuse /",
        )

        def patched(patch: dict[str, Any]) -> str | None:
            try:
                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, "old", patch, dry_run="All"
                )
            except ApiException as err:
                return str(json.loads(err.body)["message"])
            return None

        assert patched({"metadata": {"finalizers": None, "labels": {"team": "a"}}}) is None
        refusal = patched({"spec": {"suspend": False}})
        assert refusal is not None and pod_security.HOSTPATH_SETTING in refusal, refusal
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input_text=rendered, check=False)
        wait_host_paths_admitted(cluster)


@pytest.fixture
def claim(core: client.CoreV1Api, restricted: str, tmp_path: Path) -> Iterator[Path]:
    """A static hostPath PersistentVolume, as a cluster admin makes it, and a claim bound to it."""
    directory = tmp_path / "pv"
    directory.mkdir()
    pv_name = f"ckpt-{restricted}"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "hostPath": {"path": str(directory), "type": "Directory"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        restricted,
        {
            "metadata": {"name": "checkpoints"},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    wait_for(
        lambda: (
            core.read_namespaced_persistent_volume_claim("checkpoints", restricted).status.phase
            == "Bound"
        ),
        timeout=60,
        what="claim Bound",
    )
    try:
        yield directory
    finally:
        core.delete_namespaced_persistent_volume_claim("checkpoints", restricted)
        core.delete_persistent_volume(pv_name)


def test_a_restricted_trainer_writes_its_checkpoints_to_a_claim(
    core: client.CoreV1Api, restricted: str, claim: Path
) -> None:
    script = (
        "import os; open('/checkpoints/step_1', 'w').write('saved'); "
        "open('/tmp/scratch', 'w').write('x'); "
        "os.makedirs('/home/not-mine')"
    )
    pod = trainer_pod(restricted, job_body("on-claim", command=["python", "-c", script]))
    core.create_namespaced_pod(restricted, pod)
    name = pod["metadata"]["name"]
    phase = wait_for(
        lambda: (
            core.read_namespaced_pod(name, restricted).status.phase in ("Succeeded", "Failed")
            and core.read_namespaced_pod(name, restricted).status.phase
        ),
        timeout=120,
        what="the pod to finish",
    )
    log = core.read_namespaced_pod_log(name, restricted)
    # The claim and /tmp are writable; the rest of the machine is not.
    assert (claim / "step_1").read_text() == "saved"
    assert phase == "Failed", log
    assert "Read-only file system" in log
    assert not Path("/home/not-mine").exists()


@pytest.mark.trainer
@pytest.mark.usefixtures("healthy_nodes")
def test_cpu_job_in_a_restricted_namespace_recovers_from_its_claim(
    cluster: LocalCluster, restricted: str, claim: Path, operator: OperatorProcess, tmp_path: Path
) -> None:
    body = training_job("restricted", tmp_path)
    body["spec"]["checkpoint"]["volume"] = {"claimName": "checkpoints", "mountPath": "/checkpoints"}
    run = Run(cluster, restricted, operator, body)
    before = run.wait_training(step=22)
    cluster.tpujob("local", "fault", "kill", "restricted-1-0-1", "-n", restricted)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    resumed_from_checkpoint(run, before.get("checkpointStep"))
    # The checkpoints are on the claim's volume, not on the node path the job no longer names.
    assert any(claim.iterdir())
    assert not any(tmp_path.glob("[0-9]*"))
