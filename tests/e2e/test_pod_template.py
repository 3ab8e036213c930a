"""A job's pod template on the local cluster: its label, annotation, toleration, volumes and
host networking are on every worker pod, and the volumes are really mounted, since the trainer
starts only once it has read the ConfigMap the template mounts."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, training_job

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]

TOLERATION = {
    "key": "example.com/dedicated",
    "operator": "Equal",
    "value": "training",
    "effect": "NoSchedule",
}
# The trainer runs only when the ConfigMap's file is where the template mounts it.
GATE = 'test "$(cat /run-settings/mode)" = train && exec tpujob-trainer "$@"'


def test_a_pod_template_reaches_every_worker_pod_and_its_volumes_are_mounted(
    cluster: LocalCluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    core: client.CoreV1Api,
) -> None:
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "run-settings"}, "data": {"mode": "train"}}
    )
    body = training_job("templated", tmp_path, steps=30)
    trainer = body["spec"]["trainer"]
    trainer["command"] = ["sh", "-c", GATE, "sh"]
    trainer["volumeMounts"] = [
        {"name": "settings", "mountPath": "/run-settings", "readOnly": True},
        {"name": "fast-scratch", "mountPath": "/scratch"},
    ]
    trainer["podTemplate"] = {
        "metadata": {"labels": {"team": "vision"}, "annotations": {"example.com/owner": "ana"}},
        "spec": {
            "tolerations": [TOLERATION],
            "volumes": [
                {"name": "settings", "configMap": {"name": "run-settings"}},
                {"name": "fast-scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            ],
            "hostNetwork": True,
        },
    }
    run = Run(cluster, namespace, operator, body)
    run.wait_training(step=5)
    pods = run.pods(attempt=1)
    assert len(pods) == 2
    for pod in pods:
        assert pod.metadata.labels["team"] == "vision"
        assert pod.metadata.annotations["example.com/owner"] == "ana"
        tolerations = [t.to_dict() for t in pod.spec.tolerations]
        assert any(
            (t["key"], t["operator"], t["value"], t["effect"]) == tuple(TOLERATION.values())
            for t in tolerations
        ), tolerations
        volumes = {v.name: v for v in pod.spec.volumes}
        assert volumes["settings"].config_map.name == "run-settings"
        assert volumes["fast-scratch"].empty_dir.medium == "Memory"
        assert pod.spec.host_network is True
        assert pod.spec.dns_policy == "ClusterFirstWithHostNet"
    status = run.wait_phase("Succeeded")
    assert status["restarts"]["total"] == 0, status.get("lastFailure")
