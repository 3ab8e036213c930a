"""Each injected fault makes its real failure happen and the contract report it."""

from __future__ import annotations

import time

import pytest
from trainer_processes import Launcher

pytestmark = pytest.mark.trainer

BASE = ("--steps", "5", "--batch-size", "8")


@pytest.mark.parametrize(
    ("spec", "exit_status", "code", "log_mark"),
    [
        ("crash@3", -9, None, "injecting fault crash before step 3"),
        ("exit-code=3@3", 3, None, "injecting fault exit-code before step 3"),
        ("exit-code=13@3", 13, "DEVICE_BUSY", "injected fault exit-code=13"),
        ("shape@3", 21, "SHAPE_MISMATCH", "Incompatible shapes for broadcasting"),
        ("oom@3", 22, "HOST_OOM", "Unable to allocate"),
    ],
    ids=[
        "crash-is-a-real-sigkill",
        "plain-exit-code-has-no-message",
        "contract-exit-code-brings-its-message",
        "shape-raises-jax-own-error",
        "oom-is-a-real-failed-allocation",
    ],
)
def test_fault_makes_its_failure_happen(
    trainer: Launcher, spec: str, exit_status: int, code: str | None, log_mark: str
) -> None:
    process = trainer(*BASE, "--fault", spec)
    assert process.wait(120) == exit_status, process.log[-2000:]
    assert process.last_step() == 2
    assert log_mark in process.log
    message = process.message()
    if code is None:
        assert message is None
    else:
        assert message is not None and message["code"] == code and message["step"] == 2


def test_hang_stops_stepping_but_keeps_the_process_alive(trainer: Launcher) -> None:
    process = trainer(*BASE, "--fault", "hang@3")
    process.wait_for_log("injecting fault hang before step 3", timeout=120)
    time.sleep(3)
    assert process.process.poll() is None
    assert process.last_step() == 2


def test_fault_for_an_earlier_attempt_lets_a_restarted_attempt_train_on(trainer: Launcher) -> None:
    process = trainer(*BASE, env={"TPUJOB_FAULTS": "crash@3:attempt=0", "TPUJOB_ATTEMPT": "1"})
    assert process.wait(120) == 0
    assert process.last_step() == 5 and "injecting" not in process.log


@pytest.mark.parametrize(
    ("allow", "exit_status"),
    [("false", 11), ("true", 0)],
    ids=["cpu-fallback-exits-with-its-code", "allowed-cpu-fallback-trains"],
)
def test_preflight_expecting_tpus_on_a_cpu_machine(
    trainer: Launcher, allow: str, exit_status: int
) -> None:
    # JAX_PLATFORMS left empty so JAX really tries (and fails) to bring up a TPU backend.
    process = trainer(
        "--steps",
        "2",
        env={
            "JAX_PLATFORMS": "",
            "TPUJOB_EXPECT_TPU_CHIPS_PER_HOST": "4",
            "TPUJOB_ALLOW_CPU_FALLBACK": allow,
        },
    )
    assert process.wait(120) == exit_status, process.log[-2000:]
    assert "devices: backend=cpu" in process.log
    message = process.message()
    if exit_status:
        assert message is not None and message["code"] == "DEVICE_FALLBACK_TO_CPU"
        assert process.last_step() == 0
    else:
        assert message is None and process.last_step() == 2
