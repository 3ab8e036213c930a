"""The fault spec grammar and when a fault fires."""

from __future__ import annotations

import pytest

from tpujob_trainer.faults import Fault, FaultKind, due, parse_fault

pytestmark = pytest.mark.trainer


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("crash@80", Fault(FaultKind.CRASH, 80)),
        ("exit-code=3@50", Fault(FaultKind.EXIT_CODE, 50, exit_code=3)),
        ("hang@120:worker=1", Fault(FaultKind.HANG, 120, worker=1)),
        ("shape@5:attempt=0", Fault(FaultKind.SHAPE, 5, attempt=0)),
        ("oom@2:worker=0:attempt=2", Fault(FaultKind.OOM, 2, worker=0, attempt=2)),
        (" crash@1 ", Fault(FaultKind.CRASH, 1)),
    ],
    ids=["crash", "exit-code", "hang-on-one-worker", "shape-once", "oom-both-qualifiers", "spaces"],
)
def test_fault_specs_parse(spec: str, expected: Fault) -> None:
    assert parse_fault(spec) == expected


@pytest.mark.parametrize(
    "spec",
    [
        "crash",
        "crash@",
        "boom@3",
        "exit-code@3",
        "exit-code=0@3",
        "exit-code=137@3",
        "hang@3:node=1",
        "hang@-1",
    ],
    ids=[
        "no-step",
        "empty-step",
        "unknown-kind",
        "exit-code-without-code",
        "exit-code-zero",
        "exit-code-in-signal-range",
        "unknown-qualifier",
        "negative-step",
    ],
)
def test_bad_fault_specs_are_rejected(spec: str) -> None:
    with pytest.raises(ValueError, match="fault spec"):
        parse_fault(spec)


@pytest.mark.parametrize(
    ("spec", "step", "worker", "attempt", "fires"),
    [
        ("crash@5", 5, 1, 4, True),
        ("crash@5", 4, 0, 0, False),
        ("crash@5:worker=1", 5, 0, 0, False),
        ("crash@5:worker=1", 5, 1, 0, True),
        ("crash@5:attempt=0", 5, 0, 1, False),
        ("crash@5:attempt=1", 5, 0, 1, True),
    ],
    ids=[
        "every-attempt-every-worker",
        "other-step",
        "other-worker",
        "its-worker",
        "restarted-attempt-trains-on",
        "its-attempt",
    ],
)
def test_fault_fires_only_where_qualified(
    spec: str, step: int, worker: int, attempt: int, fires: bool
) -> None:
    fault = parse_fault(spec)
    assert (due([fault], step=step, worker=worker, attempt=attempt) == fault) is fires
