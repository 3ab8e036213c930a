"""Restore never loses a good checkpoint: retries, evidence, moving aside, committed steps.

Real orbax checkpoints in a temporary directory, restored in this (single) process.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tpujob_trainer.checkpointing import CORRUPT_FOLDER, ROLLED_BACK_FOLDER, Checkpoints
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.restore_policy import (
    Evidence,
    ReadFailure,
    RetryPolicy,
    classify_read_error,
    judge_step_metadata,
    read_with_retries,
)

pytestmark = pytest.mark.trainer


def state(value: float) -> dict[str, Any]:
    import jax.numpy as jnp

    return {"w": jnp.full((4, 4), value), "b": jnp.arange(3.0) + value}


def saved(directory: Path, steps: tuple[int, ...], keep: int = 5) -> None:
    checkpoints = Checkpoints(str(directory), keep=keep)
    for step in steps:
        assert checkpoints.save(step, state(float(step)))
        checkpoints.wait()
    checkpoints.close()


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


class FlakyRestores:
    """Makes orbax's own restore raise `errors` (in order) before it works again."""

    def __init__(self, checkpoints: Checkpoints, errors: list[BaseException]) -> None:
        manager = checkpoints._manager
        self.real = manager.restore
        self.errors = errors
        self.calls: list[int] = []
        manager.restore = self  # type: ignore[method-assign]

    def __call__(self, step: int, **kwargs: Any) -> Any:
        self.calls.append(step)
        if self.errors:
            raise self.errors.pop(0)
        return self.real(step, **kwargs)


@pytest.mark.parametrize(
    ("error", "failure"),
    [
        (OSError(errno.EIO, "Input/output error"), ReadFailure.TRANSIENT),
        (TimeoutError("read timed out"), ReadFailure.TRANSIENT),
        (ValueError("UNAVAILABLE: gcs backend 503"), ReadFailure.TRANSIENT),
        (ValueError("DEADLINE_EXCEEDED: reading manifest"), ReadFailure.TRANSIENT),
        (UnicodeDecodeError("utf-8", b"\x85", 0, 1, "invalid start byte"), ReadFailure.CORRUPT),
        (KeyError('Item "default" was not found in the checkpoint'), ReadFailure.CORRUPT),
        (ValueError("DATA_LOSS: checksum mismatch"), ReadFailure.CORRUPT),
        # TensorFlow's status errors by class, whatever their text says.
        (type("UnavailableError", (Exception,), {})("gs://b/ckpt-6.index"), ReadFailure.TRANSIENT),
        (type("DataLossError", (Exception,), {})("gs://b/ckpt-6.data"), ReadFailure.CORRUPT),
    ],
    ids=[
        "eio",
        "timeout",
        "unavailable-status",
        "deadline-status",
        "undecodable-bytes",
        "missing-item",
        "data-loss",
        "tf-unavailable",
        "tf-data-loss",
    ],
)
def test_read_errors_are_transient_only_for_io_and_timeouts(
    error: BaseException, failure: ReadFailure
) -> None:
    assert classify_read_error(error) is failure


@pytest.mark.parametrize(
    ("text", "evidence"),
    [
        (None, Evidence.MISSING_STEP_METADATA),
        ("{not json", Evidence.INVALID_STEP_METADATA),
        ("[1]", Evidence.INVALID_STEP_METADATA),
        ('{"init_timestamp_nsecs": 1}', None),
    ],
    ids=["missing", "not-json", "not-an-object", "valid"],
)
def test_step_metadata_is_evidence_only_when_missing_or_invalid(
    text: str | None, evidence: Evidence | None
) -> None:
    assert judge_step_metadata(lambda: text) == evidence


def test_one_transient_error_on_the_newest_step_is_retried_and_nothing_moves(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt"
    saved(directory, (3, 6))
    checkpoints = Checkpoints(str(directory), keep=5, sleep=lambda _s: None)
    flaky = FlakyRestores(checkpoints, [OSError(errno.EIO, "Input/output error")])
    restored = checkpoints.restore(state(0.0))
    assert restored is not None and restored.step == 6 and restored.skipped == ()
    assert np.asarray(restored.state["w"])[0, 0] == 6.0
    assert flaky.calls == [6, 6]
    assert listing(directory) == ["3", "6"]


def test_a_step_that_stays_unreadable_fails_the_restore_and_is_kept(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    saved(directory, (3, 6))
    slept: list[float] = []
    checkpoints = Checkpoints(
        str(directory), keep=5, sleep=slept.append, retry=RetryPolicy(attempts=3, first_delay=0.5)
    )
    FlakyRestores(checkpoints, [TimeoutError("read timed out")] * 3)
    with pytest.raises(TrainerError) as raised:
        checkpoints.restore(state(0.0))
    assert raised.value.exit_code is ExitCode.CHECKPOINT_RESTORE_FAILED
    assert "nothing was moved or deleted" in raised.value.summary
    assert slept == [0.5, 1.0]
    assert listing(directory) == ["3", "6"]


def test_the_injected_restore_error_fault_fails_one_read_only(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    saved(directory, (3, 6))
    checkpoints = Checkpoints(str(directory), keep=5, sleep=lambda _s: None, read_error_from=1)
    restored = checkpoints.restore(state(0.0))
    assert restored is not None and restored.step == 6
    assert listing(directory) == ["3", "6"]


@pytest.mark.parametrize(
    ("damage", "evidence_folder_entry"),
    [
        (lambda step: (step / "_CHECKPOINT_METADATA").unlink(), "6.attempt-2"),
        (lambda step: (step / "_CHECKPOINT_METADATA").write_text("{truncated"), "6.attempt-2"),
        (lambda step: shutil.rmtree(step / "default"), "6.attempt-2"),
        (lambda step: (step / "default" / "_METADATA").write_bytes(b"\x85garbage"), "6.attempt-2"),
    ],
    ids=["step-metadata-missing", "step-metadata-truncated", "item-missing", "item-undecodable"],
)
def test_a_corrupt_step_is_moved_aside_and_the_previous_restored(
    tmp_path: Path, damage: Any, evidence_folder_entry: str
) -> None:
    directory = tmp_path / "ckpt"
    saved(directory, (3, 6))
    damage(directory / "6")
    checkpoints = Checkpoints(str(directory), keep=5, attempt=2)
    restored = checkpoints.restore(state(0.0))
    assert restored is not None and restored.step == 3 and restored.skipped == (6,)
    assert np.asarray(restored.state["w"])[0, 0] == 3.0
    assert listing(directory) == ["3", CORRUPT_FOLDER]
    assert listing(directory / CORRUPT_FOLDER) == [evidence_folder_entry]
    # The step number is free again: the resumed run saves its own step 6.
    assert checkpoints.save(6, restored.state)
    assert checkpoints.close() == 6


def test_when_no_step_restores_nothing_is_moved(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    saved(directory, (3,))
    (directory / "3" / "_CHECKPOINT_METADATA").unlink()
    with pytest.raises(TrainerError) as raised:
        Checkpoints(str(directory), keep=5).restore(state(0.0))
    assert raised.value.exit_code is ExitCode.CHECKPOINT_RESTORE_FAILED
    assert listing(directory) == ["3"]


def test_an_uncommitted_save_is_not_a_step_and_is_cleaned(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    saved(directory, (3,))
    # What a save killed before its commit leaves: the files, without orbax's commit markers.
    partial = directory / "6.orbax-checkpoint-tmp-1234"
    shutil.copytree(directory / "3", partial)
    for marker in partial.rglob("commit_success.txt"):
        marker.unlink()
    checkpoints = Checkpoints(str(directory), keep=5)
    assert checkpoints.latest_step() == 3
    restored = checkpoints.restore(state(0.0))
    assert restored is not None and restored.step == 3
    # Orbax removes it in the background when the manager starts, at the latest before a save.
    assert checkpoints.save(6, restored.state)
    assert checkpoints.close() == 6
    assert listing(directory) == ["3", "6"]


def test_a_rollback_restores_at_or_before_the_resume_step_and_sets_newer_aside(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "ckpt"
    saved(directory, (3, 6, 9))
    restored = Checkpoints(str(directory), keep=5, attempt=4).restore(state(0.0), resume_at=7)
    assert restored is not None and restored.step == 6
    assert listing(directory) == ["3", "6", ROLLED_BACK_FOLDER]
    assert listing(directory / ROLLED_BACK_FOLDER) == ["9.attempt-4"]


def test_committed_step_moves_only_when_the_async_save_finished(tmp_path: Path) -> None:
    checkpoints = Checkpoints(str(tmp_path / "ckpt"), keep=5)
    assert checkpoints.committed_step() is None
    assert checkpoints.save(3, state(3.0))
    assert checkpoints.wait() == 3
    big = {"w": state(6.0)["w"], "x": __import__("jax.numpy").numpy.ones((2048, 2048))}
    assert checkpoints.save(6, big)
    # Right after the save started, the heartbeat must still say 3 unless it already landed.
    assert checkpoints.committed_step() in (3, 6)
    assert checkpoints.close() == 6


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        # A peer's slice was replaced while the gang saved: the save's all-gather broke.
        (
            ValueError(
                "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] "
                "Connection closed by peer [10.198.1.24]:47822"
            ),
            ExitCode.COLLECTIVE_FAILURE,
        ),
        (OSError(errno.ENOSPC, "No space left on device"), ExitCode.CHECKPOINT_SAVE_FAILED),
        # A storage client's own UNAVAILABLE or reset connection is the storage's failure.
        (RuntimeError("UNAVAILABLE: storage backend unavailable"), ExitCode.CHECKPOINT_SAVE_FAILED),
        (OSError(errno.ECONNRESET, "Connection reset by peer"), ExitCode.CHECKPOINT_SAVE_FAILED),
    ],
    ids=["lost-peer", "disk-full", "storage-unavailable", "storage-connection-reset"],
)
def test_a_save_broken_by_a_lost_peer_is_a_lost_peer_and_any_other_a_save_failure(
    tmp_path: Path, error: Exception, expected: ExitCode
) -> None:
    checkpoints = Checkpoints(str(tmp_path / "ckpt"), keep=5)

    def failing_save(*_args: Any, **_kwargs: Any) -> bool:
        raise error

    checkpoints._manager.save = failing_save  # type: ignore[method-assign]
    with pytest.raises(TrainerError) as raised:
        checkpoints.save(3, state(3.0))
    assert raised.value.exit_code == expected
    assert "saving step 3" in raised.value.summary
    checkpoints.close()


def test_a_read_retries_only_the_errors_it_is_told_and_lets_others_through() -> None:
    slept: list[float] = []

    def failing_once(error: Exception) -> Any:
        errors = [error]

        def read() -> str:
            if errors:
                raise errors.pop()
            return "state"

        return read

    policy = RetryPolicy(attempts=3)
    assert (
        read_with_retries(
            failing_once(OSError(errno.EIO, "Input/output error")),
            policy,
            what="step 1",
            errors=(OSError,),
            sleep=slept.append,
        )
        == "state"
    )
    assert slept == [0.5]
    with pytest.raises(KeyError):  # not a read error of this storage: a bug, not corruption
        read_with_retries(
            failing_once(KeyError("x")),
            policy,
            what="step 1",
            errors=(OSError,),
            sleep=slept.append,
        )
    assert slept == [0.5]
