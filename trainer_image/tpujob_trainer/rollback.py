"""Rolling back past bad data: where to resume and which batches to skip (pure).

After a non-finite loss the operator restarts the job with `TPUJOB_RESUME_STEP` (restore the
newest committed step at or before it) and `TPUJOB_SKIP_BATCHES`, the data windows to skip:
`N` (N batches right after the resume step) or `STEP:N,STEP:N` (after step STEP, N batches).
A skip moves the data, not the step counter: step k trains on batch `data_index(k)`, which is
k plus every skipped batch of the windows before it, so the run still ends at `--steps`.
The operator passes every window again on later attempts, which keeps a restarted run off the
skipped data without the trainer storing anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# A window bigger than this is a typo, not a rollback.
MAX_SKIP = 1_000_000


@dataclass(frozen=True)
class SkipWindow:
    """Skip `batches` batches of data once step `after_step` has been trained."""

    after_step: int
    batches: int


def _count(text: str, what: str, limit: int = MAX_SKIP) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"{what} {text!r} is not a non-negative integer")
    value = int(text)
    if value > limit:
        raise ValueError(f"{what} {value} is above {limit}")
    return value


def parse_resume_step(text: str | None) -> int | None:
    """The resume step, or None when unset; ValueError when it is not a step number."""
    if text is None or not text.strip():
        return None
    return _count(text, "resume step", 1 << 40)


def parse_skip_batches(text: str | None, resume_step: int | None) -> tuple[SkipWindow, ...]:
    """The skip windows; ValueError for anything malformed (the value is untrusted)."""
    if text is None or not text.strip():
        return ()
    if ":" not in text:
        if resume_step is None:
            raise ValueError(f"skip batches {text!r} without a resume step: use STEP:N")
        return (SkipWindow(resume_step, _count(text, "skip batches")),)
    windows = []
    for part in text.split(","):
        step, sep, batches = part.partition(":")
        if not sep:
            raise ValueError(f"skip window {part!r} is not STEP:N")
        windows.append(
            SkipWindow(
                _count(step, "skip window step", 1 << 40), _count(batches, "skip window batches")
            )
        )
    return tuple(sorted(windows, key=lambda w: w.after_step))


def data_index(step: int, windows: Iterable[SkipWindow]) -> int:
    """The batch that step `step` trains on: the step plus the batches skipped before it."""
    return step + sum(w.batches for w in windows if w.after_step < step)
