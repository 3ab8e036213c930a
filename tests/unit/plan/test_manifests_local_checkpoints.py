"""The local checkpoint tier in a trainer pod: a memory-backed emptyDir of the size asked (or
the default), mounted where the trainer is told to save, with its interval; nothing without
`spec.checkpoint.local`; bad values refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import job_body

from tpujob.api import contract, parse_job
from tpujob.api.constants import LOCAL_CHECKPOINT_MOUNT_PATH, LOCAL_CHECKPOINT_VOLUME
from tpujob.api.job import InvalidJobError
from tpujob.plan import manifests

VOLUME = {"hostPath": "/data/ckpt", "mountPath": "/checkpoints"}
VOLUME_X = {"name": "x", "emptyDir": {}}


def pod(checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    job = parse_job(job_body(checkpoint=checkpoint))
    return manifests.trainer_pod(job, manifests.AttemptSettings(attempt=2, pools={}), 0, 1)


def env_of(built: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in built["spec"]["containers"][0]["env"]}


def local_volume(built: dict[str, Any]) -> dict[str, Any] | None:
    found = [v for v in built["spec"]["volumes"] if v["name"] == LOCAL_CHECKPOINT_VOLUME]
    return found[0] if found else None


@pytest.mark.parametrize(
    ("local", "interval", "size"),
    [({"intervalSteps": 2, "sizeLimit": "512Mi"}, "2", "512Mi"), ({}, "10", "2Gi")],
    ids=["asked", "defaults"],
)
def test_a_local_tier_is_a_memory_backed_volume_the_trainer_saves_to(
    local: dict[str, Any], interval: str, size: str
) -> None:
    built = pod({"volume": VOLUME, "intervalSteps": 50, "local": local})
    assert local_volume(built) == {
        "name": LOCAL_CHECKPOINT_VOLUME,
        "emptyDir": {"medium": "Memory", "sizeLimit": size},
    }
    mounts = built["spec"]["containers"][0]["volumeMounts"]
    assert {"name": LOCAL_CHECKPOINT_VOLUME, "mountPath": LOCAL_CHECKPOINT_MOUNT_PATH} in mounts
    env = env_of(built)
    assert env[contract.ENV_LOCAL_CHECKPOINT_DIR] == LOCAL_CHECKPOINT_MOUNT_PATH
    assert env[contract.ENV_LOCAL_CHECKPOINT_INTERVAL] == interval
    assert env[contract.ENV_CHECKPOINT_INTERVAL] == "50"  # the persistent tier's own


@pytest.mark.parametrize(
    "checkpoint", [{"volume": VOLUME}, None], ids=["persistent-only", "no-checkpoint"]
)
def test_without_spec_checkpoint_local_there_is_no_local_tier(
    checkpoint: dict[str, Any] | None,
) -> None:
    built = pod(checkpoint)
    assert local_volume(built) is None
    assert contract.ENV_LOCAL_CHECKPOINT_DIR not in env_of(built)


@pytest.mark.parametrize(
    ("local", "field"),
    [
        ({"intervalSteps": 0}, "intervalSteps"),
        ({"sizeLimit": "-1Gi"}, "sizeLimit"),
        ({"sizeLimit": "lots"}, "sizeLimit"),
        ({"size": "1Gi"}, "size"),
    ],
    ids=["zero-interval", "negative-size", "not-a-quantity", "unknown-field"],
)
def test_a_bad_local_tier_is_refused_naming_the_field(local: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidJobError) as error:
        parse_job(job_body(checkpoint={"volume": VOLUME, "local": local}))
    assert f"spec.checkpoint.local.{field}" in str(error.value)


@pytest.mark.parametrize(
    "template",
    [
        {"volumes": [{"name": LOCAL_CHECKPOINT_VOLUME, "emptyDir": {}}]},
        {"volumeMounts": [{"name": "x", "mountPath": LOCAL_CHECKPOINT_MOUNT_PATH}]},
    ],
    ids=["volume-name", "mount-path"],
)
def test_a_pod_template_cannot_take_the_local_tiers_name_or_path(template: dict[str, Any]) -> None:
    trainer: dict[str, Any] = {
        "image": "trainer:1",
        "command": ["tpujob-trainer"],
        "podTemplate": {"spec": {"volumes": template.get("volumes", [VOLUME_X])}},
        **({"volumeMounts": template["volumeMounts"]} if "volumeMounts" in template else {}),
    }
    with pytest.raises(InvalidJobError, match="operator"):
        parse_job(job_body(trainer=trainer))
