"""Checkpoints through one orbax `CheckpointManager`: async saves, resume with fallback.

Lifecycle: build `Checkpoints` once, `restore(...)` before the first step, `save(...)` after
steps, `close()` at the end (it waits for the last async save to commit). Every method is
called by every process of the job at the same step, because orbax synchronises saves across
processes. Only committed steps are listed by orbax, so a save cut short by a kill is never
resumed from.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils

from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.model import State

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    """The result of a resume: the state, its step, and the newer steps that failed to load."""

    state: State
    step: int
    skipped: tuple[int, ...] = ()


def _directory(path: str) -> epath.Path:
    # Object-store URIs (gs://...) pass through to orbax; local paths must be absolute for it.
    return epath.Path(path) if "://" in path else epath.Path(path).resolve()


class Checkpoints:
    """Save every step it is asked to, keep the newest `keep`, resume from the newest good one."""

    def __init__(self, directory: str, *, keep: int) -> None:
        self._manager = ocp.CheckpointManager(
            _directory(directory),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, create=True, enable_async_checkpointing=True
            ),
        )

    def latest_step(self) -> int | None:
        """The newest committed step, or None."""
        step = self._manager.latest_step()
        return None if step is None else int(step)

    def save(self, step: int, state: State) -> bool:
        """Start an async save of `state` as `step`; False when the step already exists."""
        if step in self._manager.all_steps():
            return False
        try:
            return bool(self._manager.save(step, args=ocp.args.StandardSave(state), force=True))
        except Exception as error:
            raise TrainerError(
                ExitCode.CHECKPOINT_SAVE_FAILED,
                f"saving step {step} failed: {type(error).__name__}: {error}"[:600]
                + " (check the checkpoint directory's space and write permission)",
            ) from error

    def wait(self) -> None:
        """Block until every started save is committed."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Wait for pending saves and release the manager's threads."""
        self._manager.wait_until_finished()
        self._manager.close()

    def restore(self, template: State) -> Restored | None:
        """Resume from the newest step that loads, agreed by every process; None if none exist.

        `template` gives the shapes, dtypes and shardings to restore into. A step that fails to
        load is skipped (and logged), the previous one tried, and the skipped steps deleted so
        that training can save them again. All processes restore the same step: the minimum of
        what each could load.
        """
        steps = sorted((int(s) for s in self._manager.all_steps()), reverse=True)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
        restored: Restored | None = None
        skipped: list[int] = []
        for step in steps:
            try:
                state = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
            except Exception as error:
                first_line = (str(error).splitlines() or [""])[0][:300]
                log.warning(
                    "checkpoint step %d cannot be restored (%s: %s); falling back to the previous",
                    step, type(error).__name__, first_line,
                )
                skipped.append(step)
                continue
            restored = Restored(state=state, step=step, skipped=tuple(skipped))
            break
        mine = restored.step if restored else -1
        agreed = int(np.min(multihost_utils.process_allgather(np.array([mine]))))
        if agreed != mine:
            log.warning("process restored step %d, the job agreed on %d", mine, agreed)
            restored = None
            if agreed >= 0:
                state = self._manager.restore(agreed, args=ocp.args.StandardRestore(abstract))
                restored = Restored(state, agreed, tuple(s for s in steps if s > agreed))
        if restored is None and steps:
            raise TrainerError(
                ExitCode.CHECKPOINT_RESTORE_FAILED,
                f"none of the checkpoint steps {steps} could be restored; check the checkpoint "
                "directory for truncated or foreign files",
            )
        if restored is not None:
            for step in restored.skipped:
                self._manager.delete(step)
        return restored
