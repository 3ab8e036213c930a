"""The reference trainer's transformer really learns its task, and a resumed run continues the
curve where the checkpoint left it."""

from __future__ import annotations

import re
from pathlib import Path
from statistics import mean

import pytest
from trainer_processes import Launcher, TrainerProcess

pytestmark = pytest.mark.trainer

ARGS = ("--batch-size", "32", "--seed", "11", "--log-every", "1")


def losses(process: TrainerProcess) -> dict[int, float]:
    """Every logged step's loss, by step."""
    return {
        int(step): float(loss)
        for step, loss in re.findall(r"step (\d+)/\d+ loss=([0-9.eE+-]+)", process.log)
    }


def test_the_sorting_loss_falls_well_below_where_it_started(trainer: Launcher) -> None:
    run = trainer("--steps", "100", *ARGS)
    assert run.wait(240) == 0, run.log[-2000:]
    curve = losses(run)
    assert sorted(curve) == list(range(1, 101))
    first, last = mean(curve[s] for s in range(1, 21)), mean(curve[s] for s in range(81, 101))
    assert last < 0.7 * first, f"mean loss of steps 1-20 {first:.3f}, of steps 81-100 {last:.3f}"


def test_a_resumed_run_continues_the_loss_curve_of_an_uninterrupted_one(
    trainer: Launcher, tmp_path: Path
) -> None:
    checkpoints = ("--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-interval", "30")
    uninterrupted = trainer("--steps", "90", *ARGS, name="uninterrupted")
    first = trainer("--steps", "60", *ARGS, *checkpoints, name="first")
    assert first.wait(240) == 0, first.log[-2000:]
    resumed = trainer("--steps", "90", *ARGS, *checkpoints, name="resumed")
    assert resumed.wait(240) == 0 and uninterrupted.wait(240) == 0, resumed.log[-2000:]
    whole, after = losses(uninterrupted), losses(resumed)
    assert sorted(after) == list(range(61, 91)), "the resumed run redid or skipped steps"
    # Not back at the start: the restored model is the trained one...
    assert after[61] < 0.7 * mean(whole[s] for s in range(1, 21))
    # ...and it trains on exactly as if nothing had happened.
    assert after == {step: whole[step] for step in range(61, 91)}
