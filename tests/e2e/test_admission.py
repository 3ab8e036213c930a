"""The real apiserver refuses wrong TPUTrainingJobs at admission, naming the field and what is
allowed, and accepts every example and a valid job of every TPU generation.

Everything here is enforced by the generated CRD alone (OpenAPI constraints and CEL rules), with
no webhook and no operator running.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpujob.api import (
    GROUP,
    PLURAL,
    VERSION,
    FailureClass,
    LastFailure,
    Phase,
    TPUTrainingJobStatus,
    parse_status,
    status_patch,
    topology,
)
from tpujob.api.labels import BAD_NODE_TAINT, NODEPOOL

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
Mutation = Callable[[dict[str, Any]], None]


def valid_job(name: str = "job") -> dict[str, Any]:
    """Two 2-host v4 slices: 4 hosts, so multislice and budget rules all apply."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "tpu": {"accelerator": "tpu-v4-podslice", "topology": "2x2x2", "slices": 2},
            "trainer": {"image": "trainer:1", "command": ["tpujob-trainer"]},
        },
    }


def put(path: str, value: Any) -> Mutation:
    def mutate(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def drop(path: str) -> Mutation:
    def mutate(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(body: dict[str, Any]) -> None:
        for mutation in mutations:
            mutation(body)

    return mutate


def rule(**fields: Any) -> Mutation:
    return put("spec.recovery.rules", [fields])


SHM = {"name": "shm", "emptyDir": {"medium": "Memory"}}

# (id, mutation, the field the message must name, what the message must say is allowed)
REFUSED: list[tuple[str, Mutation, str, str]] = [
    (
        "unknown-accelerator",
        put("spec.tpu.accelerator", "tpu-v9"),
        "spec.tpu.accelerator",
        '"tpu-v5p-slice"',
    ),
    (
        "v5e-topology-on-v4",
        put("spec.tpu.topology", "4x4"),
        "spec.tpu.topology",
        "allowed: 2x2x1, 2x2x2",
    ),
    (
        "3d-topology-on-v5e",
        both(
            put("spec.tpu.accelerator", "tpu-v5-lite-podslice"), put("spec.tpu.topology", "4x4x4")
        ),
        "spec.tpu.topology",
        "allowed: 1x1, 2x2, 2x4, 4x4",
    ),
    (
        "v5p-only-topology-on-tpu7x",
        both(put("spec.tpu.accelerator", "tpu7x"), put("spec.tpu.topology", "16x16x16")),
        "spec.tpu.topology",
        "tpu7x; allowed: 2x2x1",
    ),
    ("malformed-topology", put("spec.tpu.topology", "big"), "spec.tpu.topology", "allowed: 2x2x1"),
    ("topology-too-long", put("spec.tpu.topology", "4x4x4x4x4x4x4x4x4"), "spec.tpu.topology", "16"),
    ("zero-slices", put("spec.tpu.slices", 0), "spec.tpu.slices", "greater than or equal to 1"),
    ("too-many-slices", put("spec.tpu.slices", 65), "spec.tpu.slices", "less than or equal to 64"),
    ("too-many-spares", put("spec.tpu.spares", 5), "spec.tpu.spares", "less than or equal to 4"),
    (
        "spares-with-autoscale",
        both(put("spec.tpu.spares", 1), put("spec.tpu.provisioning", "Autoscale")),
        "spec.tpu.spares",
        "spares needs provisioning ExistingPools",
    ),
    (
        "multislice-on-single-host-v4",
        put("spec.tpu.topology", "2x2x1"),
        "spec.tpu.slices",
        "needs a multi-host topology",
    ),
    (
        "multislice-on-single-host-v5e-2x4",
        both(put("spec.tpu.accelerator", "tpu-v5-lite-podslice"), put("spec.tpu.topology", "2x4")),
        "spec.tpu.slices",
        "tpu-v5-lite-podslice 1x1, 2x2, 2x4",
    ),
    (
        "failed-nodes-80-percent",
        put("spec.recovery.maxFailedNodes", "80%"),
        "spec.recovery.maxFailedNodes",
        "from 0% to 50%",
    ),
    (
        "failed-nodes-negative",
        put("spec.recovery.maxFailedNodes", -1),
        "spec.recovery.maxFailedNodes",
        "non-negative integer",
    ),
    (
        "failed-nodes-not-a-percentage",
        put("spec.recovery.maxFailedNodes", "ten"),
        "spec.recovery.maxFailedNodes",
        "percentage",
    ),
    (
        "failed-nodes-more-than-half-the-hosts",
        put("spec.recovery.maxFailedNodes", 3),
        "spec.recovery.maxFailedNodes",
        "at most half of the job's hosts",
    ),
    (
        "backoff-initial-above-max",
        put("spec.recovery.backoff", {"initialSeconds": 60, "maxSeconds": 5}),
        "spec.recovery.backoff.initialSeconds",
        "less than or equal to maxSeconds",
    ),
    (
        "backoff-negative",
        put("spec.recovery.backoff", {"initialSeconds": -1}),
        "spec.recovery.backoff.initialSeconds",
        "greater than or equal to 0",
    ),
    (
        "stall-timeout-too-short",
        put("spec.recovery.stallTimeoutSeconds", 5),
        "spec.recovery.stallTimeoutSeconds",
        "must be 0 (off) or at least 10",
    ),
    (
        "negative-restart-budget",
        put("spec.recovery.maxSoftRestarts", -1),
        "spec.recovery.maxSoftRestarts",
        "greater than or equal to 0",
    ),
    (
        "unknown-bad-node-action",
        put("spec.recovery.badNodeAction", "drain"),
        "spec.recovery.badNodeAction",
        '"taint", "cordon", "none"',
    ),
    (
        "regex-does-not-compile",
        rule(messagePattern="(unclosed", **{"class": "soft"}),
        "spec.recovery.rules[0].messagePattern",
        "valid RE2 regular expression",
    ),
    (
        "rule-without-matcher",
        rule(**{"class": "hard"}),
        "spec.recovery.rules[0]",
        "at least one of exitCodes, reasons or messagePattern",
    ),
    (
        "rule-unknown-class",
        rule(exitCodes=[3], **{"class": "mild"}),
        "spec.recovery.rules[0].class",
        '"soft", "medium", "hard", "fatal"',
    ),
    (
        "rule-exit-code-above-255",
        rule(exitCodes=[300], **{"class": "soft"}),
        "spec.recovery.rules[0].exitCodes[0]",
        "less than or equal to 255",
    ),
    (
        "rule-code-not-upper-snake",
        rule(exitCodes=[3], code="my_code", **{"class": "soft"}),
        "spec.recovery.rules[0].code",
        "^[A-Z][A-Z0-9_]*$",
    ),
    (
        "too-many-rules",
        put("spec.recovery.rules", [{"exitCodes": [i], "class": "soft"} for i in range(33)]),
        "spec.recovery.rules",
        "at most 32 items",
    ),
    ("unknown-spec-field", put("spec.replicas", 3), "spec.replicas", "unknown field"),
    (
        "unknown-tpu-field",
        put("spec.tpu.chipsPerHost", 4),
        "spec.tpu.chipsPerHost",
        "unknown field",
    ),
    (
        "unknown-framework",
        put("spec.framework", "pytorch"),
        "spec.framework",
        '"jax", "tensorflow"',
    ),
    ("missing-trainer", drop("spec.trainer"), "spec.trainer", "Required value"),
    ("missing-topology", drop("spec.tpu.topology"), "spec.tpu.topology", "Required value"),
    (
        "slices-wrong-type",
        put("spec.tpu.slices", "two"),
        "spec.tpu.slices",
        "must be of type integer",
    ),
    (
        "allow-cpu-fallback-wrong-type",
        put("spec.trainer.allowCpuFallback", "yes"),
        "spec.trainer.allowCpuFallback",
        "must be of type boolean",
    ),
    ("empty-image", put("spec.trainer.image", ""), "spec.trainer.image", "at least 1"),
    (
        "reserved-env-name",
        put("spec.trainer.env", [{"name": "TPUJOB_ATTEMPT", "value": "9"}]),
        "spec.trainer.env[0].name",
        "TPUJOB_ are set by the operator",
    ),
    (
        "env-value-and-value-from",
        put(
            "spec.trainer.env",
            [
                {
                    "name": "A",
                    "value": "1",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                }
            ],
        ),
        "spec.trainer.env[0].valueFrom",
        "either value or valueFrom, not both",
    ),
    (
        "duplicate-env-name",
        put("spec.trainer.env", [{"name": "A"}, {"name": "A"}]),
        "spec.trainer.env[1]",
        "Duplicate value",
    ),
    (
        "cpu-not-a-quantity",
        put("spec.trainer.resources", {"cpu": "two"}),
        "spec.trainer.resources.cpu",
        "should match",
    ),
    (
        "service-account-not-a-name",
        put("spec.trainer.serviceAccountName", "Bad_Name"),
        "spec.trainer.serviceAccountName",
        "should match",
    ),
    (
        "checkpoint-negative-interval",
        put("spec.checkpoint", {"uri": "gs://b/p", "intervalSteps": -5}),
        "spec.checkpoint.intervalSteps",
        "greater than or equal to 1",
    ),
    (
        "checkpoint-keep-zero",
        put("spec.checkpoint", {"uri": "gs://b/p", "keep": 0}),
        "spec.checkpoint.keep",
        "greater than or equal to 1",
    ),
    (
        "checkpoint-uri-and-volume",
        put("spec.checkpoint", {"uri": "gs://bucket/p", "volume": {"claimName": "pvc"}}),
        "spec.checkpoint",
        "exactly one of uri or volume",
    ),
    (
        "checkpoint-unsupported-scheme",
        put("spec.checkpoint", {"uri": "ftp://host/p"}),
        "spec.checkpoint.uri",
        "only Cloud Storage",
    ),
    (
        "checkpoint-file-uri",
        put("spec.checkpoint", {"uri": "file:///data/ckpt"}),
        "spec.checkpoint.uri",
        "use spec.checkpoint.volume",
    ),
    (
        "template-operator-label",
        put("spec.trainer.podTemplate", {"metadata": {"labels": {"tpujob.dev/job": "x"}}}),
        "spec.trainer.podTemplate.metadata.labels",
        "are the operator's",
    ),
    (
        "template-pool-selector",
        put("spec.trainer.podTemplate", {"spec": {"nodeSelector": {NODEPOOL: "mine"}}}),
        "spec.trainer.podTemplate.spec.nodeSelector",
        "chosen by the operator",
    ),
    (
        "template-tolerates-every-taint",
        put("spec.trainer.podTemplate", {"spec": {"tolerations": [{"operator": "Exists"}]}}),
        "spec.trainer.podTemplate.spec.tolerations[0].key",
        "Required value",
    ),
    (
        "template-tolerates-bad-nodes",
        put("spec.trainer.podTemplate", {"spec": {"tolerations": [{"key": BAD_NODE_TAINT}]}}),
        "spec.trainer.podTemplate.spec.tolerations[0].key",
        "operator found broken",
    ),
    (
        "template-hostpath-volume",
        put(
            "spec.trainer.podTemplate",
            {"spec": {"volumes": [{"name": "v", "hostPath": {"path": "/"}}]}},
        ),
        "spec.trainer.podTemplate.spec.volumes[0].hostPath",
        "unknown field",
    ),
    (
        "template-volume-two-sources",
        put(
            "spec.trainer.podTemplate",
            {"spec": {"volumes": [{"name": "v", "emptyDir": {}, "secret": {"secretName": "s"}}]}},
        ),
        "spec.trainer.podTemplate.spec.volumes[0]",
        "exactly one of emptyDir",
    ),
    (
        "mount-of-no-volume",
        put("spec.trainer.volumeMounts", [{"name": "shm", "mountPath": "/dev/shm"}]),
        "spec.trainer.volumeMounts",
        "names a volume of spec.trainer.podTemplate",
    ),
    (
        "mount-over-scratch",
        both(
            put("spec.trainer.podTemplate", {"spec": {"volumes": [SHM]}}),
            put("spec.trainer.volumeMounts", [{"name": "shm", "mountPath": "/tmp"}]),
        ),
        "spec.trainer.volumeMounts[0].mountPath",
        "mounted by the operator",
    ),
    (
        "mount-over-checkpoints",
        both(
            put("spec.checkpoint", {"volume": {"claimName": "ckpt"}}),
            put("spec.trainer.podTemplate", {"spec": {"volumes": [SHM]}}),
            put("spec.trainer.volumeMounts", [{"name": "shm", "mountPath": "/checkpoints"}]),
        ),
        "spec.trainer.volumeMounts",
        "checkpoint volume is mounted there",
    ),
    (
        "checkpoint-volume-without-source",
        put("spec.checkpoint", {"volume": {"mountPath": "/ckpt"}}),
        "spec.checkpoint.volume",
        "exactly one of claimName or hostPath",
    ),
    ("name-too-long", put("metadata.name", "j" * 41), "metadata.name", "at most 40 characters"),
    ("name-not-dns-1035", put("metadata.name", "7up"), "metadata.name", "DNS-1035 label"),
    (
        "negative-ttl",
        put("spec.ttlSecondsAfterFinished", -1),
        "spec.ttlSecondsAfterFinished",
        "greater than or equal to 0",
    ),
]


@pytest.fixture(scope="module")
def api(cluster: Any, crds_installed: None) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(cluster.api_client())


@pytest.fixture(scope="module")
def admission_namespace(cluster: Any) -> Iterator[str]:
    # One namespace for the whole table: refused objects are never stored, so the cases
    # cannot see each other, and ~45 namespaces would only slow the run down.
    core = client.CoreV1Api(cluster.api_client())
    # Unique: a namespace of an earlier run may still be terminating.
    name = f"admission-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def create(api: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> Any:
    return api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
    )


def refusal(call: Callable[[], Any]) -> str:
    """The apiserver's message for a refused request (fails the test if it was accepted)."""
    with pytest.raises(ApiException) as caught:
        call()
    # 422 for invalid values; 400 for unknown fields, which strict decoding refuses first.
    assert caught.value.status in (400, 422), caught.value.body
    return str(json.loads(caught.value.body)["message"])


@pytest.mark.parametrize(
    ("mutation", "field", "allowed"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_wrong_manifest_is_refused_naming_the_field_and_what_is_allowed(
    api: client.CustomObjectsApi,
    admission_namespace: str,
    mutation: Mutation,
    field: str,
    allowed: str,
) -> None:
    body = valid_job("refused")
    mutation(body)
    message = refusal(lambda: create(api, admission_namespace, body))
    assert field in message, message
    assert allowed in message, message


def one_job_per_generation() -> list[tuple[str, str, int]]:
    """The largest multi-host shape of each accelerator under 100 hosts, as two slices."""
    jobs = []
    for row in topology.ACCELERATORS:
        shapes = [topology.resolve(row.label, t) for t in row.chips_per_host]
        fitting = [s for s in shapes if s.multi_host and s.hosts <= 100]
        jobs.append((row.label, fitting[-1].topology, 2))
    return jobs


@pytest.mark.parametrize(
    ("accelerator", "topo", "slices"),
    one_job_per_generation(),
    ids=[a.generation.value for a in topology.ACCELERATORS],
)
def test_valid_job_of_every_generation_is_accepted(
    api: client.CustomObjectsApi, admission_namespace: str, accelerator: str, topo: str, slices: int
) -> None:
    body = valid_job(f"gen-{accelerator}")
    body["spec"]["tpu"] = {"accelerator": accelerator, "topology": topo, "slices": slices}
    created = create(api, admission_namespace, body)
    defaults = {"provisioning": "ExistingPools", "spares": 0}
    assert created["spec"]["tpu"] == {**defaults, **body["spec"]["tpu"]}


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.stem)
def test_example_is_accepted(
    api: client.CustomObjectsApi, admission_namespace: str, path: Path
) -> None:
    body = yaml.safe_load(path.read_text())
    created = create(api, admission_namespace, body)
    defaults = {"slices": 1, "provisioning": "ExistingPools", "spares": 0}
    assert created["spec"]["tpu"] == {**defaults, **body["spec"]["tpu"]}


def test_schema_defaults_are_visible_on_the_stored_object(
    api: client.CustomObjectsApi, admission_namespace: str
) -> None:
    created = create(api, admission_namespace, valid_job("defaults"))
    spec = created["spec"]
    assert spec["framework"] == "jax"
    assert spec["tpu"]["provisioning"] == "ExistingPools"
    assert spec["suspend"] is False
    assert spec["trainer"]["allowCpuFallback"] is False
    recovery = spec["recovery"]
    assert recovery["autoRecovery"] is True
    assert recovery["maxFailedNodes"] == "20%"
    assert recovery["badNodeAction"] == "taint"
    assert recovery["backoff"] == {"initialSeconds": 10, "maxSeconds": 300}


@pytest.mark.parametrize(
    ("field", "value"),
    [("accelerator", "tpu-v5p-slice"), ("topology", "2x2x4"), ("slices", 1)],
    ids=["accelerator", "topology", "slices"],
)
def test_tpu_fields_cannot_change_after_creation(
    api: client.CustomObjectsApi, admission_namespace: str, field: str, value: Any
) -> None:
    name = f"immutable-{field}"
    create(api, admission_namespace, valid_job(name))
    patch = {"spec": {"tpu": {field: value}}}
    message = refusal(
        lambda: api.patch_namespaced_custom_object(
            GROUP, VERSION, admission_namespace, PLURAL, name, patch
        )
    )
    assert f"spec.tpu.{field}" in message, message
    assert "immutable" in message, message


def test_status_the_operator_writes_is_stored_unchanged(
    api: client.CustomObjectsApi, admission_namespace: str
) -> None:
    create(api, admission_namespace, valid_job("status"))
    status = TPUTrainingJobStatus(
        phase=Phase.RECOVERING,
        attempt=3,
        checkpoint_step=200,
        failed_node_budget=1,
        failed_node_budget_left=0,
        last_failure=LastFailure(
            failure_class=FailureClass.HARD,
            code="DEVICE_COUNT_MISMATCH",
            summary="fewer accelerator devices than requested",
            chain=("tpu-0 lost", "collective timed out on tpu-1"),
            node="node-a",
        ),
    )
    stored = api.patch_namespaced_custom_object_status(
        GROUP, VERSION, admission_namespace, PLURAL, "status", {"status": status_patch(status)}
    )
    assert parse_status(stored["status"]) == status


def test_base_job_of_the_refusal_table_is_accepted(
    api: client.CustomObjectsApi, admission_namespace: str
) -> None:
    # Each refusal must come from its mutation alone.
    assert len(REFUSED) >= 30
    created = create(api, admission_namespace, valid_job("base"))
    assert created["metadata"]["name"] == "base"
