"""`--framework tensorflow`: CONFIG_ERROR without TensorFlow, training and resume with it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from trainer_processes import Launcher

pytestmark = pytest.mark.trainer

HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None


@pytest.mark.skipif(HAS_TENSORFLOW, reason="TensorFlow is importable here")
def test_missing_tensorflow_is_a_config_error(trainer: Launcher) -> None:
    process = trainer("--framework", "tensorflow", "--steps", "2")
    assert process.wait(60) == 10
    message = process.message()
    assert message is not None and message["code"] == "CONFIG_ERROR"
    assert "tpujob-trainer[tensorflow]" in message["summary"]


@pytest.mark.skipif(not HAS_TENSORFLOW, reason="TensorFlow is not installed")
def test_tensorflow_trains_and_resumes_from_its_checkpoint(
    trainer: Launcher, tmp_path: Path
) -> None:
    args = ("--framework", "tensorflow", "--batch-size", "8", "--checkpoint-interval", "3",
            "--checkpoint-dir", str(tmp_path / "tf-ckpt"))
    first = trainer(*args, "--steps", "6", name="first")
    assert first.wait(300) == 0, first.log[-2000:]
    assert "strategy: default" in first.log and first.last_step() == 6
    resumed = trainer(*args, "--steps", "9", name="resumed")
    assert resumed.wait(300) == 0, resumed.log[-2000:]
    assert "resumed from step 6" in resumed.log and "step 6/" not in resumed.log
    assert resumed.last_step() == 9
