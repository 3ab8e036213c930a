"""Fault injection for demos and recovery drills: each fault makes a real failure happen.

A spec is `KIND@STEP[:worker=I][:attempt=A]`. The one-shot kinds (`crash`, `exit-code=N`, `hang`,
`shape`, `oom`, `nan`) fire when step STEP is about to run; the lasting kinds (`slow-input`,
`straggle`, `leak`) start at STEP and stay on; `restore-error` names a checkpoint step instead:
the first read of the newest checkpoint at or after STEP fails once with a transient I/O error.
A fault applies on the matching worker and attempt; without `:attempt` it applies on every
attempt, which is how a deterministic bug looks to the operator. Parsing is pure; `inject`
makes the one-shot kinds happen, the training loops apply the others.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass


class FaultKind(enum.StrEnum):
    """What an injected fault does."""

    CRASH = "crash"  # SIGKILL to itself, as the kernel's OOM killer or a segfault would end it
    EXIT_CODE = "exit-code"  # exit with the given code (a contract code brings its message)
    HANG = "hang"  # stop stepping and block; peers block in their collective
    SHAPE = "shape"  # feed a batch of the wrong shape; JAX raises its own shape error
    OOM = "oom"  # a real allocation that cannot succeed: MemoryError
    NAN = "nan"  # the step's inputs carry a NaN, so the real loss is NaN
    RESTORE_ERROR = "restore-error"  # one transient OSError reading a checkpoint step
    SLOW_INPUT = "slow-input"  # every batch from STEP on waits SLOW_INPUT_SECONDS more
    STRAGGLE = "straggle"  # every step from STEP on spends STRAGGLE_SECONDS more on the host
    LEAK = "leak"  # every step from STEP on keeps LEAK_BYTES more host memory


LASTING = frozenset({FaultKind.SLOW_INPUT, FaultKind.STRAGGLE, FaultKind.LEAK})
SLOW_INPUT_SECONDS = 0.2
STRAGGLE_SECONDS = 0.2
LEAK_BYTES = 16 << 20


@dataclass(frozen=True)
class Fault:
    """One parsed fault spec."""

    kind: FaultKind
    step: int
    exit_code: int | None = None
    worker: int | None = None
    attempt: int | None = None

    def applies(self, *, worker: int, attempt: int) -> bool:
        """Whether this fault is meant for `worker` in `attempt` at all."""
        return (self.worker is None or self.worker == worker) and (
            self.attempt is None or self.attempt == attempt
        )

    def fires(self, *, step: int, worker: int, attempt: int) -> bool:
        """Whether this one-shot fault fires before `step` runs on `worker` in `attempt`."""
        return (
            self.kind not in LASTING
            and self.kind is not FaultKind.RESTORE_ERROR
            and self.step == step
            and self.applies(worker=worker, attempt=attempt)
        )

    def active(self, *, step: int, worker: int, attempt: int) -> bool:
        """Whether this lasting fault is on while `step` runs on `worker` in `attempt`."""
        return (
            self.kind in LASTING
            and step >= self.step
            and self.applies(worker=worker, attempt=attempt)
        )


_SPEC = re.compile(
    r"^(?P<kind>crash|hang|shape|oom|nan|restore-error|slow-input|straggle|leak"
    r"|exit-code=(?P<code>\d+))@(?P<step>\d+)"
    r"(?P<qualifiers>(?::(?:worker|attempt)=\d+)*)$"
)


def parse_fault(spec: str) -> Fault:
    """Parse one spec; ValueError with the accepted grammar when it does not match."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(
            f"bad fault spec {spec!r}: expected KIND@STEP[:worker=I][:attempt=A] with KIND in "
            "crash, hang, shape, oom, nan, exit-code=N, restore-error, slow-input, straggle, leak"
        )
    qualifiers: dict[str, int] = {}
    for part in filter(None, match["qualifiers"].split(":")):
        key, value = part.split("=")
        qualifiers[key] = int(value)
    code = match["code"]
    if code is not None and not 0 < int(code) < 126:
        raise ValueError(f"bad fault spec {spec!r}: exit code must be within 1..125")
    return Fault(
        kind=FaultKind.EXIT_CODE if code is not None else FaultKind(match["kind"]),
        step=int(match["step"]),
        exit_code=int(code) if code is not None else None,
        worker=qualifiers.get("worker"),
        attempt=qualifiers.get("attempt"),
    )


def parse_faults(specs: Iterable[str]) -> tuple[Fault, ...]:
    """Parse every non-empty spec (flags and the comma-separated env value alike)."""
    return tuple(parse_fault(spec) for spec in specs if spec.strip())


def due(faults: Iterable[Fault], *, step: int, worker: int, attempt: int) -> Fault | None:
    """The first one-shot fault that fires before `step`, if any."""
    return next((f for f in faults if f.fires(step=step, worker=worker, attempt=attempt)), None)


def lasting(
    faults: Iterable[Fault], kind: FaultKind, *, step: int, worker: int, attempt: int
) -> bool:
    """Whether a lasting fault of `kind` is on while `step` runs."""
    return any(
        f.kind is kind and f.active(step=step, worker=worker, attempt=attempt) for f in faults
    )


def restore_error_from(faults: Iterable[Fault], *, worker: int, attempt: int) -> int | None:
    """The checkpoint step from which one injected transient read error applies, if any."""
    steps = [
        f.step
        for f in faults
        if f.kind is FaultKind.RESTORE_ERROR and f.applies(worker=worker, attempt=attempt)
    ]
    return min(steps) if steps else None
