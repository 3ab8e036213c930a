"""The regrading table: each row sees the grade the rows above left, and says what it changed."""

from __future__ import annotations

import pytest
from tests.unit.builders import at, job_body, observed, running_status

from tpujob import diagnosis as dx
from tpujob.diagnosis.escalation import escalate
from tpujob.plan.regrading import REGRADING, Around, Row, regrade

WEAK_FATAL_GUESS = dx.Diagnosis(
    failure_class=dx.FailureClass.FATAL,
    code=dx.FailureCode.USER_CODE_ERROR,
    summary="worker 0: ValueError in the data pipeline",
    confidence=dx.Confidence.LOW,
    rule="text-model",
    signature="USER_CODE_ERROR:ValueError",
    step=40,
    probability=0.41,
)


def around(history: tuple[dx.PastFailure, ...] = ()) -> Around:
    return Around(
        obs=observed(job_body(status=running_status(attempt=1))),
        history=history,
        diagnosed_class=WEAK_FATAL_GUESS.failure_class,
        root_node="pool-0-w0",
        root_slice=0,
        progressed=True,
        unknown_retry_limit=3,
        now=at(0),
    )


def test_the_rows_run_in_the_documented_order() -> None:
    assert [row for row, _ in REGRADING] == [
        Row.LEAK,
        Row.MODEL_GUESS,
        Row.REPEAT_GUARD,
        Row.HISTORY,
        Row.LEDGER,
    ]


@pytest.mark.parametrize(
    ("case", "history", "graded", "code"),
    [
        ("a weak fatal guess is restarted once", (), dx.FailureClass.MEDIUM, "USER_CODE_ERROR"),
        (
            "the same failure at the same step again fails the job, after the guess was weakened",
            (
                dx.PastFailure(
                    signature="USER_CODE_ERROR:ValueError",
                    code=dx.FailureCode.USER_CODE_ERROR,
                    step=40,
                ),
            ),
            dx.FailureClass.FATAL,
            "DETERMINISTIC_REPEAT",
        ),
    ],
)
def test_a_weak_guess_is_weakened_and_the_repeat_guard_judges_the_weakened_grade(
    case: str, history: tuple[dx.PastFailure, ...], graded: dx.FailureClass, code: str
) -> None:
    result = regrade(WEAK_FATAL_GUESS, around(history))
    assert result.diagnosis.failure_class is graded, case
    assert str(result.diagnosis.code) == code, case
    assert any(e.source is dx.Source.MODEL for e in result.diagnosis.evidence), case
    assert result.record is not None and result.record.code == code, case


def test_a_regrade_keeps_what_it_is_not_told_to_change_and_says_why() -> None:
    why = dx.Evidence(dx.Source.HISTORY, "failed twice on pool-0-w0")
    hard = escalate(WEAK_FATAL_GUESS, to=dx.FailureClass.HARD, note=" (the node)", evidence=why)
    assert hard.failure_class is dx.FailureClass.HARD
    assert hard.summary == "worker 0: ValueError in the data pipeline (the node)"
    assert hard.evidence[-1] == why
    assert (hard.code, hard.advice, hard.signature) == (
        WEAK_FATAL_GUESS.code,
        WEAK_FATAL_GUESS.advice,
        WEAK_FATAL_GUESS.signature,
    )
