"""A supervised trainer container killed whole restarts in its pod: the container (never the pod)
gets restartPolicy Never and one rule restarting it on exit 137, and the supervisor is told where
its state file lies in the scratch emptyDir. Only a trainer whose command names its supervisor
gets the rule: one of one's own, or an image entry point the operator cannot read, gets none."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import job_body

from tpujob.api import contract, parse_job
from tpujob.api.constants import SCRATCH_MOUNT_PATH, SCRATCH_VOLUME
from tpujob.plan import manifests

RULES = [{"action": "Restart", "exitCodes": {"operator": "In", "values": [137]}}]


def trainer_pod(trainer: dict[str, Any]) -> dict[str, Any]:
    job = parse_job(job_body(trainer={"image": "trainer:1", **trainer}))
    return manifests.trainer_pod(job, manifests.AttemptSettings(attempt=1, pools={}), 0, 1)


@pytest.mark.parametrize(
    ("trainer", "rules"),
    [
        ({"command": ["tpujob-trainer"]}, RULES),
        ({"command": ["/usr/local/bin/tpujob-trainer"], "args": ["--steps", "5"]}, RULES),
        ({"command": ["python3", "-m", "tpujob_trainer"]}, RULES),
        ({"command": ["python", "-m", "tpujob_trainer.rejoin", "python", "loop.py"]}, RULES),
        ({}, None),
        ({"command": ["python", "train.py"]}, None),
        ({"command": ["python", "-m", "my_trainer"], "args": ["tpujob-trainer"]}, None),
        ({"command": ["tpujob-trainer"], "args": ["--steps", "5", "--no-rejoin"]}, None),
        ({"command": ["tpujob-trainer", "--no-rejoin"]}, None),
    ],
    ids=[
        "reference",
        "reference-by-path",
        "reference-module",
        "own-loop-under-the-supervisor",
        "image-entrypoint-unknown",
        "own-loop-alone",
        "supervisor-named-only-in-args",
        "no-rejoin-arg",
        "no-rejoin-command",
    ],
)
def test_only_a_supervised_trainer_restarts_in_its_pod_on_exit_137(
    trainer: dict[str, Any], rules: list[dict[str, Any]] | None
) -> None:
    pod = trainer_pod(trainer)
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container.get("restartPolicyRules") == rules
    assert container.get("restartPolicy") == ("Never" if rules else None)


def test_the_supervisor_state_file_lies_in_the_scratch_volume_that_outlives_the_container() -> None:
    pod = trainer_pod({"command": ["tpujob-trainer"]})
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    path = env[contract.ENV_SUPERVISOR_STATE]
    assert path.startswith(SCRATCH_MOUNT_PATH + "/")
    assert {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT_PATH} in container["volumeMounts"]
    scratch = [v for v in pod["spec"]["volumes"] if v["name"] == SCRATCH_VOLUME]
    assert len(scratch) == 1 and "emptyDir" in scratch[0]


def test_the_restarted_exit_code_is_the_one_a_sigkill_leaves() -> None:
    assert contract.CONTAINER_RESTART_EXIT_CODES == (128 + 9,)
    assert contract.ExitCode.ENDED_AFTER_KILL not in contract.CONTAINER_RESTART_EXIT_CODES
