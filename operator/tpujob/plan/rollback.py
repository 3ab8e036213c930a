"""Rolling back after a non-finite loss: where the next attempt resumes, what data it skips.

A NaN or inf loss is usually a bad batch meeting a fragile optimiser state. Restarting from
the same checkpoint on the same data repeats it; the operator instead restores the last
checkpoint before the anomaly and skips the batches between that checkpoint and the step
that went non-finite (the trainer shifts its data, not its step count), at most
`spec.recovery.maxNanRollbacks` times. After that the data is not the cause, and the job
fails with advice. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

NAN_ADVICE = (
    "the loss turned non-finite again after skipping the data before it, so the data is not "
    "the cause: lower the learning rate or lengthen its warmup, clip gradients (for example "
    "optax.clip_by_global_norm), use loss scaling with reduced precision, and look for "
    "divisions or logarithms of values that can reach zero"
)


@dataclass(frozen=True)
class Rollback:
    """The next attempt's restore point and the data windows every later attempt skips."""

    resume_step: int
    skip: int
    windows: str  # STEP:N,... in the trainer contract's ENV_SKIP_BATCHES form
    count: int  # rollbacks done, this one included

    def describe(self, limit: int) -> str:
        return (
            f"rolled back to step {self.resume_step}, skipping {self.skip} batches after "
            f"it (rollback {self.count} of {limit})"
        )


def plan_rollback(
    *, nan_step: int | None, checkpoint_step: int | None, windows: str | None, done: int
) -> Rollback:
    """The rollback after a non-finite loss at `nan_step`.

    The restore point is the newest checkpoint strictly before the anomaly (a checkpoint
    written at that very step may hold the poisoned state); without one, the run starts over.
    The skipped window covers the batches from the restore point up to the anomaly's step.
    """
    step = max(0, nan_step) if nan_step is not None else None
    resume = 0
    if (
        checkpoint_step is not None
        and checkpoint_step >= 0
        and (step is None or checkpoint_step < step)
    ):
        resume = checkpoint_step
    skip = max(1, step - resume) if step is not None else 1
    window = f"{resume}:{skip}"
    return Rollback(
        resume_step=resume,
        skip=skip,
        windows=f"{windows},{window}" if windows else window,
        count=done + 1,
    )
