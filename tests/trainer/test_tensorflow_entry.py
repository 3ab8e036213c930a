"""`--framework tensorflow`: the same contract as the JAX loop, run as real TensorFlow processes.

CONFIG_ERROR without TensorFlow (imports of it blocked in that one process), training and
resume, a transient read error on restore retried, the SIGTERM save and PREEMPTED, the
non-finite loss stop, the device preflight, an elastic attempt on fewer slices.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from trainer_processes import Launcher

pytestmark = pytest.mark.trainer

TF = ("--framework", "tensorflow", "--batch-size", "8")
# `python -c` with TensorFlow's import blocked the documented way (a None entry in
# sys.modules makes `import tensorflow` raise ImportError), then the trainer's own entry point.
WITHOUT_TENSORFLOW = (
    "-c",
    "import sys; sys.modules['tensorflow'] = None; "
    "from tpujob_trainer.__main__ import main; main()",
)
TIMEOUT = 300


def test_missing_tensorflow_is_a_config_error(trainer: Launcher) -> None:
    process = trainer(*TF, "--steps", "2", program=WITHOUT_TENSORFLOW)
    assert process.wait(TIMEOUT) == 10, process.log[-2000:]
    message = process.message()
    assert message is not None and message["code"] == "CONFIG_ERROR"
    assert "tpujob-trainer[tensorflow]" in message["summary"]
    assert "training steps" not in process.log


def test_tensorflow_trains_and_resumes_from_its_checkpoint(
    trainer: Launcher, tmp_path: Path
) -> None:
    args = (*TF, "--checkpoint-interval", "3", "--checkpoint-dir", str(tmp_path / "tf-ckpt"))
    first = trainer(*args, "--steps", "6", name="first")
    assert first.wait(TIMEOUT) == 0, first.log[-2000:]
    assert "strategy: default" in first.log and first.last_step() == 6
    assert "devices: backend=cpu" in first.log and "checkpoint step 6 committed" in first.log
    resumed = trainer(*args, "--steps", "9", name="resumed")
    assert resumed.wait(TIMEOUT) == 0, resumed.log[-2000:]
    assert "resumed from step 6" in resumed.log and "step 6/" not in resumed.log
    assert "training steps 7..9" in resumed.log and resumed.last_step() == 9


def test_a_transient_read_error_restoring_the_newest_checkpoint_is_retried_and_resumes_there(
    trainer: Launcher, tmp_path: Path
) -> None:
    directory = tmp_path / "tf-ckpt"
    args = (*TF, "--checkpoint-interval", "3", "--checkpoint-dir", str(directory))
    first = trainer(*args, "--steps", "6", name="first")
    assert first.wait(TIMEOUT) == 0, first.log[-2000:]
    before = sorted(p.name for p in directory.iterdir())
    resumed = trainer(*args, "--steps", "9", "--fault", "restore-error@6", name="resumed")
    assert resumed.wait(TIMEOUT) == 0, resumed.log[-2000:]
    assert "transient read error" in resumed.log and "injected" in resumed.log
    assert "resumed from step 6" in resumed.log and "falling back" not in resumed.log
    after = {p.name for p in directory.iterdir()}
    assert {"ckpt-6.index", "ckpt-9.index"} <= after
    assert all(name in after for name in before if not name.startswith("ckpt-3"))


def test_sigterm_saves_the_step_reached_and_exits_preempted_with_it(
    trainer: Launcher, tmp_path: Path
) -> None:
    directory = tmp_path / "tf-ckpt"
    args = (*TF, "--checkpoint-interval", "1000", "--checkpoint-dir", str(directory))
    run = trainer(*args, "--steps", "100000", "--step-time", "0.1")
    run.wait_for_log(r"step 3/", timeout=TIMEOUT)
    run.process.send_signal(signal.SIGTERM)
    assert run.wait(TIMEOUT) == 42, run.log[-2000:]
    message = run.message()
    assert message is not None and message["code"] == "PREEMPTED"
    step = message["checkpoint_step"]
    assert step >= 3 and step == message["step"] == run.last_step()
    assert f"stopped by SIGTERM after saving step {step}" == message["summary"]
    assert (directory / f"ckpt-{step}.index").exists()
    resumed = trainer(*args, "--steps", str(step + 2), name="resumed")
    assert resumed.wait(TIMEOUT) == 0, resumed.log[-2000:]
    assert f"resumed from step {step}" in resumed.log and resumed.last_step() == step + 2


def test_an_injected_nan_stops_with_the_non_finite_loss_contract_and_the_saved_step(
    trainer: Launcher, tmp_path: Path
) -> None:
    run = trainer(
        *TF,
        "--steps",
        "10",
        "--checkpoint-interval",
        "2",
        "--fault",
        "nan@6",
        "--checkpoint-dir",
        str(tmp_path / "tf-ckpt"),
    )
    assert run.wait(TIMEOUT) == 24, run.log[-2000:]
    message = run.message()
    assert message is not None and message["code"] == "NAN_LOSS"
    assert (message["step"], message["checkpoint_step"]) == (6, 4)
    assert "loss at step 6 is nan" in message["summary"]


def test_expecting_tpus_on_a_cpu_machine_is_the_fallback_failure(trainer: Launcher) -> None:
    run = trainer(*TF, "--steps", "2", env={"TPUJOB_EXPECT_TPU_CHIPS_PER_HOST": "4"})
    assert run.wait(TIMEOUT) == 11, run.log[-2000:]
    message = run.message()
    assert message is not None and message["code"] == "DEVICE_FALLBACK_TO_CPU"
    assert "TensorFlow fell back to cpu" in message["summary"]
    assert "devices: backend=cpu" in run.log and run.last_step() == 0


def test_an_attempt_on_fewer_slices_trains_every_worker_on_the_whole_batch_without_a_row_cap(
    trainer: Launcher,
) -> None:
    # A cap the JAX loop would refuse (8 rows do not split into 3 equal micro-batches).
    run = trainer(
        *TF,
        "--steps",
        "2",
        "--max-rows-per-process",
        "3",
        env={"MEGASCALE_NUM_SLICES": "1", "TPUJOB_PLANNED_SLICES": "2"},
    )
    assert run.wait(TIMEOUT) == 0, run.log[-2000:]
    assert (
        "training on 1 of 2 slices: the global batch of 8 is kept, every worker trains on all "
        "of it as at full strength" in run.log
    )
    assert run.last_step() == 2
