"""Resuming from orbax checkpoints: the right step, bit-for-bit state, fallback past a bad one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from trainer_processes import Launcher, TrainerProcess

pytestmark = pytest.mark.trainer

ARGS = ("--batch-size", "8", "--seed", "5", "--checkpoint-interval", "3")


def test_resume_continues_at_the_saved_step_with_identical_state(
    trainer: Launcher, tmp_path: Path
) -> None:
    directory = str(tmp_path / "ckpt")
    first = trainer("--steps", "6", "--checkpoint-dir", directory, *ARGS, name="first")
    uninterrupted = trainer("--steps", "9", *ARGS, name="uninterrupted")
    assert first.wait(120) == 0
    resumed = trainer("--steps", "9", "--checkpoint-dir", directory, *ARGS, name="resumed")
    assert resumed.wait(120) == 0 and uninterrupted.wait(120) == 0
    assert "training steps 7..9" in resumed.log
    assert "step 6/" not in resumed.log
    assert resumed.digest("resumed from step 6") == first.digest("saving step 6")
    assert resumed.digest("done") == uninterrupted.digest("done")
    assert resumed.final_loss() == uninterrupted.final_loss()


def test_corrupted_latest_checkpoint_falls_back_to_the_previous_one(
    trainer: Launcher, tmp_path: Path
) -> None:
    directory = tmp_path / "ckpt"
    first = trainer("--steps", "6", "--checkpoint-dir", str(directory), *ARGS, name="first")
    assert first.wait(120) == 0
    corrupted = [p for p in (directory / "6").rglob("*") if p.is_file() and "default" in p.parts]
    assert corrupted
    for path in corrupted:
        path.write_bytes(b"\x85not a checkpoint\x00" * 4)
    resumed = trainer("--steps", "7", "--checkpoint-dir", str(directory), *ARGS, name="resumed")
    assert resumed.wait(120) == 0
    assert "checkpoint step 6 cannot be restored" in resumed.log
    assert "checkpoint fallback: steps [6] could not be restored, resumed from 3" in resumed.log
    assert resumed.digest("resumed from step 3") == first.digest("saving step 3")
    # Moved aside as evidence, never deleted.
    assert sorted(p.name for p in (directory / "corrupt").iterdir()) == ["6.attempt-0"]
    # Replaying steps 4..6 from step 3 rebuilds exactly the state the corrupted step held.
    assert resumed.digest("saving step 6") == first.digest("saving step 6")


def test_a_transient_read_error_on_the_newest_step_is_retried_and_nothing_is_lost(
    trainer: Launcher, tmp_path: Path
) -> None:
    directory = tmp_path / "ckpt"
    first = trainer("--steps", "6", "--checkpoint-dir", str(directory), *ARGS, name="first")
    assert first.wait(120) == 0
    resumed = trainer(
        "--steps",
        "7",
        "--checkpoint-dir",
        str(directory),
        *ARGS,
        name="resumed",
        env={"TPUJOB_FAULTS": "restore-error@1"},
    )
    assert resumed.wait(120) == 0, resumed.log[-2000:]
    assert "checkpoint step 6: transient read error (OSError" in resumed.log
    assert resumed.digest("resumed from step 6") == first.digest("saving step 6")
    assert sorted(p.name for p in directory.iterdir()) == ["3", "6", "7"]


def test_a_read_error_on_one_worker_of_two_keeps_every_step_and_both_resume_together(
    job: Callable[..., list[TrainerProcess]], tmp_path: Path
) -> None:
    directory = str(tmp_path / "ckpt")
    first = job("--steps", "6", "--checkpoint-dir", directory, *ARGS, name="first")
    assert [w.wait(180) for w in first] == [0, 0]
    resumed = job(
        "--steps",
        "7",
        "--checkpoint-dir",
        directory,
        *ARGS,
        name="resumed",
        env={"TPUJOB_FAULTS": "restore-error@1:worker=1"},
    )
    assert [w.wait(180) for w in resumed] == [0, 0], resumed[1].log[-2000:]
    assert "transient read error" in resumed[1].log
    assert "transient read error" not in resumed[0].log
    assert all("resumed from step 6" in w.log for w in resumed)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["3", "6", "7"]
