"""The SDK example loop (a user's own JAX loop, not the reference trainer) as real processes."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from trainer_processes import TRAINER_ROOT, Launcher, TrainerProcess

pytestmark = pytest.mark.trainer

EXAMPLE = (str(TRAINER_ROOT / "examples" / "sdk_loop.py"),)
Job = Callable[..., list[TrainerProcess]]


def test_example_trains_saves_and_resumes_from_its_checkpoint(
    trainer: Launcher, tmp_path: Path
) -> None:
    env = {"TPUJOB_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    first = trainer("--steps", "20", program=EXAMPLE, env=env, name="first")
    assert first.wait(120) == 0, first.log[-2000:]
    losses = [float(v) for v in re.findall(r"loss=([0-9.eE+-]+)", first.log)]
    assert losses[-1] < losses[0]
    assert "checkpoint step 20 committed" in first.log
    resumed = trainer("--steps", "30", program=EXAMPLE, env=env, name="resumed")
    assert resumed.wait(120) == 0, resumed.log[-2000:]
    assert "resumed from step 20" in resumed.log and "step 10/" not in resumed.log
    assert "checkpoint step 30 committed" in resumed.log


def test_an_injected_nan_ends_with_the_non_finite_loss_contract_at_its_step(
    trainer: Launcher, tmp_path: Path
) -> None:
    env = {"TPUJOB_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "TPUJOB_FAULTS": "nan@14"}
    run = trainer("--steps", "30", program=EXAMPLE, env=env)
    assert run.wait(120) == 24, run.log[-2000:]
    message = run.message()
    assert message is not None
    assert (message["code"], message["step"], message["checkpoint_step"]) == ("NAN_LOSS", 14, 10)
    assert "loss at step 14 is nan" in message["summary"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["10"]


def test_a_rollback_resumes_at_the_given_step_and_skips_the_bad_window(
    trainer: Launcher, tmp_path: Path
) -> None:
    """The NaN is tied to the data of step 14 (attempt 0 only sees it, as with a bad record)."""
    directory = tmp_path / "ckpt"
    first = trainer(
        "--steps",
        "20",
        program=EXAMPLE,
        name="first",
        env={"TPUJOB_CHECKPOINT_DIR": str(directory)},
    )
    assert first.wait(120) == 0
    rollback = trainer(
        "--steps",
        "20",
        program=EXAMPLE,
        name="rollback",
        env={
            "TPUJOB_CHECKPOINT_DIR": str(directory),
            "TPUJOB_RESUME_STEP": "12",
            "TPUJOB_SKIP_BATCHES": "5",
            "TPUJOB_ATTEMPT": "1",
        },
    )
    assert rollback.wait(120) == 0, rollback.log[-2000:]
    assert "resumed from step 10" in rollback.log
    assert sorted(p.name for p in (directory / "rolled-back").iterdir()) == ["20.attempt-1"]
    # Same steps, other data: the losses after the rollback differ from the first run's.
    assert first.final_loss() != rollback.final_loss()


def test_sigterm_saves_the_agreed_step_and_exits_preempted(
    trainer: Launcher, tmp_path: Path
) -> None:
    run = trainer(
        "--steps", "100000", program=EXAMPLE, env={"TPUJOB_CHECKPOINT_DIR": str(tmp_path / "ckpt")}
    )
    run.wait_for_log(r"step 20/", 120)
    run.process.send_signal(signal.SIGTERM)
    assert run.wait(120) == 42, run.log[-2000:]
    message = run.message()
    assert message is not None and message["code"] == "PREEMPTED"
    assert message["checkpoint_step"] == message["step"]
    assert (tmp_path / "ckpt" / str(message["step"])).is_dir()


def test_health_names_the_straggling_worker_and_the_slow_input(job: Job) -> None:
    workers = job(
        "--steps",
        "20",
        program=EXAMPLE,
        env={
            "TPUJOB_FAULTS": "straggle@1:worker=1,slow-input@1:worker=0",
            "TPUJOB_HEALTH_EVERY_STEPS": "10",
        },
    )
    assert [w.wait(240) for w in workers] == [0, 0], workers[0].log[-2000:]
    lines = re.findall(
        r"health step=20 input_bound=([0-9.]+) worker_step_s=([0-9.,]+)", workers[0].log
    )
    assert lines, workers[0].log[-2000:]
    input_bound, step_seconds = float(lines[0][0]), [float(v) for v in lines[0][1].split(",")]
    # Worker 0 waits 0.2 s per batch: about half the job's time is spent waiting for data.
    assert input_bound > 0.2
    # Worker 1 spends 0.2 s more on the host per step than worker 0 does.
    assert step_seconds[1] - step_seconds[0] > 0.15
