"""Checkpoints through one orbax `CheckpointManager`: fenced async saves, a careful resume.

Lifecycle: build `Checkpoints` once, `restore(...)` before the first step, `save(...)` after
steps, `close()` at the end (it waits for the last async save to commit). Every method is
called by every process of the job at the same step, because saves, restores and fencing are
collective.

Safety rules (see `restore_policy` for the evidence and `fencing` for the token):

* Orbax lists only committed steps; a save cut short leaves a `<step>.orbax-checkpoint-tmp*`
  directory, which is never read as a step and is removed when the manager starts.
* A step that fails to read for a transient reason is read again with backoff; if it still
  fails, nothing is moved or deleted and the run stops with CHECKPOINT_RESTORE_FAILED (class
  medium: the operator retries later). Falling back past a good step because the storage
  blinked would silently throw away training.
* A step is moved aside into `corrupt/` only on evidence (metadata missing or invalid, bytes
  that do not deserialise), and only after every process agreed on the step to resume from;
  then the previous step is restored. Nothing is ever deleted by a restore.
* A rollback (`resume_at`) moves the steps after the chosen one into `rolled-back/`, so the
  rolled-back run saves those step numbers again instead of colliding with them.
* `committed_step()` is the newest step whose async save finished: what the heartbeat reports.
"""

from __future__ import annotations

import enum
import errno
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from tpujob_trainer.collectives import gather_ints
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import TrainerError, raised_by_a_collective
from tpujob_trainer.fencing import SaveGate
from tpujob_trainer.restore_policy import (
    ITEM_METADATA,
    ITEM_NAME,
    STEP_METADATA,
    Evidence,
    ReadFailed,
    ReadFailure,
    RetryPolicy,
    judge_step_metadata,
    read_with_retries,
)

log = logging.getLogger(__name__)

CORRUPT_FOLDER = "corrupt"
ROLLED_BACK_FOLDER = "rolled-back"

State = Any


class Source(enum.StrEnum):
    """Which tier a restored step was read from (see `tiers`)."""

    PERSISTENT = "persistent"
    LOCAL = "local"
    PEER = "peer"


@dataclass(frozen=True)
class Restored:
    """The result of a resume: the state, its step, the newer steps set aside, and the tier."""

    state: State
    step: int
    skipped: tuple[int, ...] = ()
    source: Source = Source.PERSISTENT
    # For a restore from another tier: the persistent tier's newest step (None: it has none).
    persistent_step: int | None = None

    @property
    def durable_step(self) -> int | None:
        """The newest step that outlives the pods: what the heartbeat's checkpoint step says."""
        return self.step if self.source is Source.PERSISTENT else self.persistent_step


@dataclass(frozen=True)
class _Corrupt:
    evidence: Evidence
    detail: str


@dataclass(frozen=True)
class _Unreadable:
    detail: str


def _directory(path: str) -> epath.Path:
    # Object-store URIs (gs://...) pass through to orbax; local paths must be absolute for it.
    return epath.Path(path) if "://" in path else epath.Path(path).resolve()


class Checkpoints:
    """Save the steps it is asked to (when fencing allows), keep `keep`, resume safely."""

    def __init__(
        self,
        directory: str,
        *,
        keep: int,
        attempt: int = 0,
        gate: SaveGate | None = None,
        retry: RetryPolicy | None = None,
        read_error_from: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._root = _directory(directory)
        self._manager = ocp.CheckpointManager(
            self._root,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                enable_async_checkpointing=True,
                cleanup_tmp_directories=True,
            ),
        )
        self._attempt = attempt
        self._gate = gate
        self._retry = retry or RetryPolicy()
        self._sleep = sleep
        # One injected transient read error (fault `restore-error`), then reads work again.
        self._read_error_from = read_error_from
        self._pending: int | None = None
        self._committed: int | None = None

    def latest_step(self, at_most: int | None = None) -> int | None:
        """The newest committed step (at or before `at_most`), or None."""
        if at_most is None:
            step = self._manager.latest_step()
            return None if step is None else int(step)
        steps = [int(s) for s in self._manager.all_steps() if int(s) <= at_most]
        return max(steps, default=None)

    def committed_step(self) -> int | None:
        """The newest step whose save has committed on every process (None before any)."""
        if self._pending is not None and not self._manager.is_saving_in_progress():
            self._committed, self._pending = self._pending, None
        return self._committed

    def save(self, step: int, state: State) -> bool:
        """Start an async save of `state` as `step` if fencing allows; False when not saved.

        Raises `FencedError` when a newer attempt owns the checkpoints.
        """
        if self._gate is not None and not self._gate.authorize(step):
            return False
        if step in self._manager.all_steps():
            return False
        try:
            started = bool(self._manager.save(step, args=ocp.args.StandardSave(state), force=True))
        except Exception as error:
            if raised_by_a_collective(error):
                # The save's collective broke because a peer went away (a slice restarted
                # under this one): a lost peer, which the supervisor holds for a rejoin order,
                # not a storage failure of this worker's own.
                raise TrainerError(
                    ExitCode.COLLECTIVE_FAILURE,
                    f"saving step {step} lost a peer: {type(error).__name__}: {error}"[:600],
                ) from error
            raise TrainerError(
                ExitCode.CHECKPOINT_SAVE_FAILED,
                f"saving step {step} failed: {type(error).__name__}: {error}"[:600]
                + " (check the checkpoint directory's space and write permission)",
            ) from error
        if started:
            self.committed_step()
            self._pending = step
        return started

    def wait(self) -> int | None:
        """Block until every started save is committed; the committed step."""
        self._manager.wait_until_finished()
        return self.committed_step()

    def close(self) -> int | None:
        """Wait for pending saves and release the manager's threads; the committed step."""
        self._manager.wait_until_finished()
        committed = self.committed_step()
        self._manager.close()
        return committed

    def restore(self, template: State, *, resume_at: int | None = None) -> Restored | None:
        """Resume from the newest step that loads, agreed by every process; None if none exist.

        `template` gives the shapes, dtypes and shardings to restore into. With `resume_at`,
        only steps at or before it are candidates and newer ones are rolled back (moved aside).
        """
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        steps = sorted((int(s) for s in self._manager.all_steps()), reverse=True)
        rolled_back = [s for s in steps if resume_at is not None and s > resume_at]
        candidates = [s for s in steps if s not in rolled_back]
        mine, state, unreadable = -1, None, ""
        for step in candidates:
            outcome = self._read(step, abstract)
            if isinstance(outcome, _Corrupt):
                log.warning(
                    "checkpoint step %d cannot be restored (%s: %s); falling back to the previous",
                    step,
                    outcome.evidence,
                    outcome.detail,
                )
                continue
            if isinstance(outcome, _Unreadable):
                unreadable = f"step {step}: {outcome.detail}"
                break
            mine, state = step, outcome
            break
        rows = gather_ints([mine, int(bool(unreadable))])
        if any(row[1] for row in rows):
            raise TrainerError(
                ExitCode.CHECKPOINT_RESTORE_FAILED,
                f"a checkpoint could not be read after {self._retry.attempts} tries "
                f"({unreadable or 'on another worker'}); nothing was moved or deleted, a later "
                "attempt reads it again. Check the checkpoint storage's availability",
            )
        agreed = min(row[0] for row in rows)
        if agreed != mine and agreed >= 0:
            log.warning("process restored step %d, the job agreed on %d", mine, agreed)
            outcome = self._read(agreed, abstract)
            state = None if isinstance(outcome, _Corrupt | _Unreadable) else outcome
        if not all(row[0] for row in gather_ints([int(agreed < 0 or state is not None)])):
            raise TrainerError(
                ExitCode.CHECKPOINT_RESTORE_FAILED,
                f"the agreed checkpoint step {agreed} could not be read on every worker",
            )
        if agreed < 0 and candidates:
            raise TrainerError(
                ExitCode.CHECKPOINT_RESTORE_FAILED,
                f"none of the checkpoint steps {candidates} could be restored; nothing was "
                "moved or deleted. Check the checkpoint directory for truncated or foreign files",
            )
        corrupt = tuple(s for s in candidates if s > agreed)
        self._set_aside(corrupt, CORRUPT_FOLDER)
        self._set_aside(tuple(rolled_back), ROLLED_BACK_FOLDER)
        if agreed < 0:
            return None
        return Restored(state=state, step=agreed, skipped=corrupt)

    def roll_back_after(self, step: int) -> None:
        """Move the steps after `step` aside into `rolled-back/` (a rollback restored from
        another tier). Collective."""
        newer = tuple(int(s) for s in self._manager.all_steps() if int(s) > step)
        agreed = gather_ints([len(newer)])
        if any(row[0] for row in agreed):
            # Every process joins the move's barriers, even one whose listing was empty.
            self._set_aside(newer, ROLLED_BACK_FOLDER, joined=True)

    def _read(self, step: int, abstract: State) -> State | _Corrupt | _Unreadable:
        """One step, with transient errors retried; the state or why it did not load."""

        def load() -> State | _Corrupt:
            evidence = self._inspect(step)
            if evidence is not None:
                return _Corrupt(evidence, "the step's files say it was not committed whole")
            restored: State = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
            return restored

        outcome = read_with_retries(
            load, self._retry, what=f"checkpoint step {step}", sleep=self._sleep
        )
        if not isinstance(outcome, ReadFailed):
            return outcome
        if outcome.failure is ReadFailure.CORRUPT:
            return _Corrupt(Evidence.UNDECODABLE, outcome.detail)
        return _Unreadable(outcome.detail)

    def _inspect(self, step: int) -> Evidence | None:
        """Evidence of corruption in the step's layout; raises OSError when storage fails."""
        if self._read_error_from is not None and step >= self._read_error_from:
            self._read_error_from = None
            raise OSError(errno.EIO, f"injected transient read error on checkpoint step {step}")
        path = self._root / str(step)

        def read_metadata() -> str | None:
            metadata = path / STEP_METADATA
            return metadata.read_text() if metadata.exists() else None

        evidence = judge_step_metadata(read_metadata)
        if evidence is None and not (path / ITEM_NAME / ITEM_METADATA).exists():
            evidence = Evidence.MISSING_ITEM
        return evidence

    def _set_aside(self, steps: tuple[int, ...], folder: str, *, joined: bool = False) -> None:
        """Move `steps` into `folder` (process 0 moves; everybody waits for it)."""
        if not steps and not joined:
            return
        gather_ints([0])  # every process has finished reading before anything moves
        if jax.process_index() == 0:
            target = self._root / folder
            target.mkdir(parents=True, exist_ok=True)
            for step in steps:
                destination = target / f"{step}.attempt-{self._attempt}"
                suffix = 0
                while destination.exists():
                    suffix += 1
                    destination = target / f"{step}.attempt-{self._attempt}.{suffix}"
                (self._root / str(step)).rename(destination)
                log.warning("checkpoint step %d moved aside to %s", step, destination)
        gather_ints([0])
        self._manager.reload()
