"""A status failure record becomes the one record both history readers use, old ones too."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tpujob import diagnosis as dx
from tpujob.api.attempt import FailureRecord
from tpujob.diagnosis.memory import Escalation, judge
from tpujob.plan.job_memory import past_failure

CASES: list[tuple[str, dict[str, Any], dx.PastFailure]] = [
    (
        "full",
        {
            "signature": "PROCESS_CRASHED:segfault",
            "code": "PROCESS_CRASHED",
            "step": 40,
            "node": "pool-0-w1",
            "attempt": 2,
            "slice": 1,
            "class": "medium",
            "memorySignature": "PROCESS_CRASHED:0123456789ab",
            "progressed": True,
        },
        dx.PastFailure(
            signature="PROCESS_CRASHED:segfault",
            code=dx.FailureCode.PROCESS_CRASHED,
            step=40,
            node="pool-0-w1",
            slice_index=1,
            attempt=2,
            failure_class=dx.FailureClass.MEDIUM,
            memory_signature="PROCESS_CRASHED:0123456789ab",
            progressed=True,
        ),
    ),
    (
        "written-before-the-memory",
        {"signature": "DEVICE_BUSY:x", "code": "DEVICE_BUSY", "node": "n7"},
        dx.PastFailure(signature="DEVICE_BUSY:x", code=dx.FailureCode.DEVICE_BUSY, node="n7"),
    ),
    (
        "code-and-class-of-another-version",
        {"signature": "GONE:x", "code": "GONE", "attempt": 1, "class": "weird"},
        dx.PastFailure(signature="GONE:x", code=None, attempt=1),
    ),
]


@pytest.mark.parametrize(("case", "record", "expected"), CASES, ids=[c[0] for c in CASES])
def test_a_status_record_becomes_the_expected_past_failure(
    case: str, record: dict[str, Any], expected: dx.PastFailure
) -> None:
    assert past_failure(FailureRecord.model_validate(record)) == expected, case


def test_the_memory_skips_records_without_its_fields() -> None:
    full = replace(CASES[0][2], progressed=False)
    old = replace(full, memory_signature=None)
    # The same failure twice on one node blames it, unless the first predates the memory.
    assert judge([full, full]).escalation is Escalation.SAME_NODE
    assert judge([old, full]).escalation is Escalation.NONE
