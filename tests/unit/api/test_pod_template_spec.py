"""spec.trainer.podTemplate and volumeMounts: what a user may add, and what stays the operator's."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.api.test_api_spec import minimal

from tpujob.api import InvalidJobError, parse_job
from tpujob.api.pod_template import qualified_name_error


def job_with(trainer_extra: dict[str, Any], **spec_extra: Any) -> dict[str, Any]:
    body = minimal()
    body["spec"]["trainer"].update(trainer_extra)
    body["spec"].update(spec_extra)
    return body


def template(**spec: Any) -> dict[str, Any]:
    return {"podTemplate": {"spec": spec}}


SHM = {"name": "shm", "emptyDir": {"medium": "Memory"}}

REFUSED: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
    (
        "operator label",
        {"podTemplate": {"metadata": {"labels": {"tpujob.dev/job": "other"}}}},
        {},
        "spec.trainer.podTemplate.metadata.labels",
        "are the operator's",
    ),
    (
        "managed-by label",
        {"podTemplate": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}}},
        {},
        "spec.trainer.podTemplate.metadata.labels",
        "are the operator's",
    ),
    (
        "label key not a qualified name",
        {"podTemplate": {"metadata": {"labels": {"team name": "a"}}}},
        {},
        "spec.trainer.podTemplate.metadata.labels",
        "not a qualified name",
    ),
    (
        "label value too long",
        {"podTemplate": {"metadata": {"labels": {"team": "a" * 64}}}},
        {},
        "spec.trainer.podTemplate.metadata.labels.team",
        "at most 63",
    ),
    (
        "operator annotation",
        {"podTemplate": {"metadata": {"annotations": {"tpujob.dev/rejoin": "x"}}}},
        {},
        "spec.trainer.podTemplate.metadata.annotations",
        "are the operator's",
    ),
    (
        "pool selector",
        template(nodeSelector={"cloud.google.com/gke-nodepool": "mine"}),
        {},
        "spec.trainer.podTemplate.spec.nodeSelector",
        "chosen by the operator",
    ),
    (
        "hostname selector",
        template(nodeSelector={"kubernetes.io/hostname": "n1"}),
        {},
        "spec.trainer.podTemplate.spec.nodeSelector",
        "chosen by the operator",
    ),
    (
        "toleration of every taint",
        template(tolerations=[{"operator": "Exists"}]),
        {},
        "spec.trainer.podTemplate.spec.tolerations[0].key",
        "Field required",
    ),
    (
        "toleration of the bad-node taint",
        template(tolerations=[{"key": "tpujob.dev/unhealthy", "operator": "Exists"}]),
        {},
        "spec.trainer.podTemplate.spec.tolerations[0]",
        "operator found broken",
    ),
    (
        "toleration seconds without NoExecute",
        template(tolerations=[{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]),
        {},
        "spec.trainer.podTemplate.spec.tolerations[0]",
        "only to effect NoExecute",
    ),
    (
        "volume with two sources",
        template(volumes=[{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]),
        {},
        "spec.trainer.podTemplate.spec.volumes[0]",
        "exactly one of",
    ),
    (
        "hostPath volume",
        template(volumes=[{"name": "v", "hostPath": {"path": "/"}}]),
        {},
        "spec.trainer.podTemplate.spec.volumes[0].hostPath",
        "Extra inputs",
    ),
    (
        "operator volume name",
        template(volumes=[{"name": "tmp", "emptyDir": {}}]),
        {},
        "spec.trainer.podTemplate.spec.volumes[0]",
        "are the operator's",
    ),
    (
        "duplicate volume names",
        template(volumes=[SHM, SHM]),
        {},
        "spec.trainer.podTemplate.spec.volumes",
        "unique",
    ),
    (
        "mount of no volume",
        {"volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]},
        {},
        "spec.trainer",
        "not a volume of spec.trainer.podTemplate.spec.volumes",
    ),
    (
        "mount over scratch",
        {"volumeMounts": [{"name": "shm", "mountPath": "/tmp"}], **template(volumes=[SHM])},
        {},
        "spec.trainer.volumeMounts[0]",
        "mounted by the operator",
    ),
    (
        "mount climbing out of its volume",
        {"volumeMounts": [{"name": "shm", "mountPath": "/x", "subPath": "a/../../b"}]},
        {},
        "spec.trainer.volumeMounts[0]",
        "'..'",
    ),
    (
        "mount over the checkpoint volume",
        {"volumeMounts": [{"name": "shm", "mountPath": "/checkpoints"}], **template(volumes=[SHM])},
        {"checkpoint": {"volume": {"claimName": "ckpt"}}},
        "spec",
        "where the checkpoint volume is mounted",
    ),
]


@pytest.mark.parametrize(
    ("trainer", "spec", "path", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_template_naming_the_operators_fields_or_malformed_is_refused(
    trainer: dict[str, Any], spec: dict[str, Any], path: str, message: str
) -> None:
    with pytest.raises(InvalidJobError) as caught:
        parse_job(job_with(trainer, **spec))
    assert any(e.path == path and message in e.message for e in caught.value.errors), (
        caught.value.errors
    )


def test_a_full_template_is_accepted() -> None:
    job = parse_job(
        job_with(
            {
                "volumeMounts": [
                    {"name": "shm", "mountPath": "/dev/shm"},
                    {"name": "data", "mountPath": "/data", "readOnly": True},
                ],
                "podTemplate": {
                    "metadata": {"labels": {"team": "vision"}, "annotations": {"a.b/c": "d"}},
                    "spec": {
                        "tolerations": [
                            {"key": "cloud.google.com/gke-spot", "value": "true"},
                            {
                                "key": "maint",
                                "operator": "Exists",
                                "effect": "NoExecute",
                                "tolerationSeconds": 30,
                            },
                        ],
                        "nodeSelector": {"cloud.google.com/reservation-name": "r1"},
                        "priorityClassName": "training-high",
                        "volumes": [
                            SHM,
                            {
                                "name": "data",
                                "csi": {
                                    "driver": "gcsfuse.csi.storage.gke.io",
                                    "volumeAttributes": {"bucketName": "data"},
                                },
                            },
                        ],
                        "hostNetwork": True,
                        "imagePullSecrets": [{"name": "registry"}],
                    },
                },
            },
            checkpoint={"volume": {"claimName": "ckpt"}},
        )
    )
    template = job.spec.trainer.pod_template
    assert template is not None
    assert [v.name for v in template.spec.volumes] == ["shm", "data"]
    assert template.spec.host_network is True


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        ("team", True),
        ("example.com/team", True),
        ("a.b-c/x_y.z", True),
        ("-team", False),
        ("team-", False),
        ("Example.com/team", False),
        ("example.com/", False),
        ("a/b/c", False),
        ("x" * 64, False),
        ("x" * 63, True),
    ],
)
def test_qualified_names_follow_kubernetes(key: str, valid: bool) -> None:
    assert (qualified_name_error(key) is None) is valid
