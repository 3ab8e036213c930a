"""Real multi-process training on the CPU backend: agreement, a dead peer, and SIGTERM."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from trainer_processes import Launcher, TrainerProcess

pytestmark = pytest.mark.trainer

Job = Callable[..., list[TrainerProcess]]


def losses(process: TrainerProcess) -> list[float]:
    return [float(v) for v in re.findall(r"step \d+/\d+ loss=([0-9.]+)", process.log)]


def test_two_processes_reach_the_same_loss_as_one_on_the_same_global_batch(
    job: Job, trainer: Launcher
) -> None:
    args = ("--steps", "8", "--batch-size", "8", "--seed", "3")
    workers = job(*args)
    single = trainer(*args, name="single")
    assert [w.wait(180) for w in workers] == [0, 0]
    assert single.wait(180) == 0
    assert "global=2" in workers[0].log and "global=1" in single.log
    assert losses(workers[0]) == losses(workers[1])
    assert len(losses(single)) == 8
    assert losses(workers[0]) == pytest.approx(losses(single), rel=1e-5, abs=1e-6)
    # Training really learns: the loss falls.
    assert losses(single)[-1] < losses(single)[0]


def test_killing_one_worker_makes_the_other_fail_with_a_collective_error(job: Job) -> None:
    workers = job(
        "--steps",
        "100000",
        "--batch-size",
        "8",
        "--step-time",
        "0.05",
        "--log-every",
        "5",
        env={"TPUJOB_COLLECTIVE_TIMEOUT_SECONDS": "10"},
    )
    workers[1].wait_for_log(r"step 10/", timeout=120)
    workers[1].process.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    code = workers[0].wait(timeout=90)
    elapsed = time.monotonic() - killed_at
    assert elapsed < 60, f"survivor took {elapsed:.0f}s to notice the dead peer"
    message = workers[0].message()
    if code >= 0:
        # The survivor's own handler ran: the contract names the failure.
        assert code in (30, 31), workers[0].log[-2000:]
        assert message is not None and message["code"] in (
            "COLLECTIVE_FAILURE",
            "COLLECTIVE_TIMEOUT",
        )
        assert message["worker"] == 0 and message["step"] >= 10
    else:
        # The coordination service aborted the process from C++: the log carries the cause.
        assert re.search(r"Gloo|heartbeat timeout|UNAVAILABLE", workers[0].log), workers[0].log
    assert re.search(
        r"Gloo|Connection (closed|reset) by peer|heartbeat timeout|UNAVAILABLE", workers[0].log
    )


def test_sigterm_to_one_worker_stops_every_worker_at_one_committed_step_and_both_resume_it(
    job: Job, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "ckpt"
    args = (
        "--batch-size",
        "8",
        "--checkpoint-dir",
        str(checkpoints),
        "--checkpoint-interval",
        "1000",
    )
    workers = job("--steps", "100000", "--step-time", "0.1", *args)
    workers[0].wait_for_log(r"step 3/", timeout=120)
    workers[1].process.send_signal(signal.SIGTERM)
    assert [w.wait(90) for w in workers] == [42, 42]
    messages = [w.message() for w in workers]
    assert all(m is not None and m["code"] == "PREEMPTED" for m in messages)
    saved = {m["checkpoint_step"] for m in messages if m}
    assert len(saved) == 1
    step = saved.pop()
    assert step >= 3 and step == workers[0].last_step() == workers[1].last_step()
    assert (checkpoints / str(step) / "commit_success.txt").exists()
    assert not list(checkpoints.glob("*tmp*"))
    restarted = job("--steps", str(step + 2), *args, name="restarted")
    assert [w.wait(120) for w in restarted] == [0, 0]
    for worker in restarted:
        assert f"resumed from step {step} " in worker.log
        assert worker.last_step() == step + 2
