"""Where a trainer pod's JAX compilation cache lives: in the checkpoint directory of a JAX job,
which every attempt sees; nowhere for TensorFlow or a job without checkpoints; the job's own
value wins."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import job_body

from tpujob.api import contract, parse_job
from tpujob.plan import manifests

VOLUME = {"volume": {"hostPath": "/data/ckpt", "mountPath": "/checkpoints"}}


def cache_dir(**spec: Any) -> str | None:
    job = parse_job(job_body(**spec))
    pod = manifests.trainer_pod(job, manifests.AttemptSettings(attempt=1, pools={}), 0, 0)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    return env.get(contract.ENV_JAX_COMPILATION_CACHE_DIR)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, "gs://bucket/ckpt/jax-compilation-cache"),
        (
            {"checkpoint": {"uri": "gs://bucket/runs/a/"}},
            "gs://bucket/runs/a/jax-compilation-cache",
        ),
        ({"checkpoint": VOLUME}, "/checkpoints/jax-compilation-cache"),
        ({"framework": "tensorflow"}, None),
        ({"checkpoint": None}, None),
    ],
    ids=["gs-uri", "trailing-slash", "volume", "tensorflow", "no-checkpoint"],
)
def test_a_jax_job_caches_compiled_programs_beside_its_checkpoints(
    spec: dict[str, Any], expected: str | None
) -> None:
    assert cache_dir(**spec) == expected


@pytest.mark.parametrize("value", ["/mnt/cache", ""], ids=["own-folder", "off"])
def test_the_jobs_own_cache_setting_wins(value: str) -> None:
    trainer = {
        "image": "trainer:1",
        "command": ["tpujob-trainer"],
        "env": [{"name": contract.ENV_JAX_COMPILATION_CACHE_DIR, "value": value}],
    }
    assert cache_dir(trainer=trainer) == value
