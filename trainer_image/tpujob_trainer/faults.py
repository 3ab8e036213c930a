"""Fault injection for demos and recovery drills: each fault makes a real failure happen.

A spec is `KIND@STEP[:worker=I][:attempt=A]`, with KIND one of `crash`, `exit-code=N`, `hang`,
`shape`, `oom`. The fault fires when the step is about to run, on the matching worker and
attempt; without `:attempt` it fires on every attempt, which is how a deterministic bug looks
to the operator. Parsing is pure; `FaultKind` values name what the trainer does when one fires
(see `trainer.Trainer._inject`).
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


@dataclass(frozen=True)
class Fault:
    """One parsed fault spec."""

    kind: FaultKind
    step: int
    exit_code: int | None = None
    worker: int | None = None
    attempt: int | None = None

    def fires(self, *, step: int, worker: int, attempt: int) -> bool:
        """Whether this fault fires before `step` runs on `worker` in `attempt`."""
        return (
            self.step == step
            and (self.worker is None or self.worker == worker)
            and (self.attempt is None or self.attempt == attempt)
        )


_SPEC = re.compile(
    r"^(?P<kind>crash|hang|shape|oom|exit-code=(?P<code>\d+))@(?P<step>\d+)"
    r"(?P<qualifiers>(?::(?:worker|attempt)=\d+)*)$"
)


def parse_fault(spec: str) -> Fault:
    """Parse one spec; ValueError with the accepted grammar when it does not match."""
    match = _SPEC.match(spec.strip())
    if not match:
        raise ValueError(
            f"bad fault spec {spec!r}: expected KIND@STEP[:worker=I][:attempt=A] with KIND in "
            "crash, hang, shape, oom, exit-code=N"
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
    """The first fault that fires before `step`, if any."""
    return next((f for f in faults if f.fires(step=step, worker=worker, attempt=attempt)), None)
