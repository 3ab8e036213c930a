"""Text from outside reaches the diagnosis through one gate, where what UTF-8 cannot encode
(lone surrogates) is replaced.

A log, a termination message or an Event can carry a lone surrogate (a JSON `\\ud800`
escape, bytes decoded with `surrogateescape`); RE2, the signature hashes and the status
write all encode to UTF-8, and must not raise on it.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tpujob.diagnosis import (
    Diagnosis,
    FailureClass,
    FailureCode,
    JobFacts,
    PendingFacts,
    RuleTableError,
    UserRule,
    WorkerFacts,
    diagnose_job,
    diagnose_worker,
)
from tpujob.diagnosis.facts import encodable, encodable_facts
from tpujob.diagnosis.memory import failure_signature

LONE = "\ud800"
LOW = "\udcff"  # what `surrogateescape` makes of a byte that is not UTF-8
SHAPE_TRACEBACK = (
    "Traceback (most recent call last):\nTypeError: dot_general requires"
    " contracting dimensions to have the same shape, got (3,) and (4,)"
)


def trainer_json(summary: str, traceback: str) -> str:
    # json.dumps writes a lone surrogate as an escape; json.loads turns it back into one.
    return json.dumps(
        {
            "code": "SHAPE_MISMATCH",
            "exit_code": 21,
            "class_hint": "fatal",
            "summary": summary,
            "traceback": traceback,
        }
    )


def all_text(d: Diagnosis) -> str:
    return "\n".join(
        [
            d.summary,
            d.headline,
            d.signature,
            d.advice,
            d.action,
            *(str(e) for e in d.evidence),
            *(str(link) for link in d.chain),
        ]
    )


CASES = {
    "log": (
        WorkerFacts(exit_code=1, log_tail=f"noise {LOW}\n{SHAPE_TRACEBACK} {LONE}"),
        FailureCode.SHAPE_MISMATCH,
    ),
    "free-text-message": (
        WorkerFacts(exit_code=1, message=f"{SHAPE_TRACEBACK} {LOW}"),
        FailureCode.SHAPE_MISMATCH,
    ),
    "trainer-json-escapes": (
        WorkerFacts(
            exit_code=21, message=trainer_json(f"bad shape {LONE}", f"{SHAPE_TRACEBACK} {LOW}")
        ),
        FailureCode.SHAPE_MISMATCH,
    ),
    # Nothing else to go on: the text model reads the context.
    "context": (WorkerFacts(exit_code=1, context=f"Warning BackOff restarting {LONE}"), None),
    "scheduler-message": (
        WorkerFacts(pending=PendingFacts(f"0/4 nodes are available: Insufficient {LONE}", 900)),
        None,
    ),
}


@pytest.mark.parametrize("case", CASES, ids=str)
def test_unencodable_text_is_diagnosed_as_its_readable_twin(case: str) -> None:
    worker, code = CASES[case]
    d = diagnose_job(JobFacts(workers=(replace(worker, worker_index=0),)))
    all_text(d).encode("utf-8")  # raises UnicodeEncodeError if a surrogate got through
    failure_signature(d.code, d.summary)
    twin = diagnose_worker(_replaced(worker))
    assert (d.code, d.failure_class, d.rule) == (twin.code, twin.failure_class, twin.rule)
    if code is not None:
        assert d.code is code


def _replaced(worker: WorkerFacts) -> WorkerFacts:
    """The worker as if every unencodable code point had been U+FFFD from the start."""

    def fix(text: str) -> str:
        return (
            text.replace(LONE, "\ufffd")
            .replace(LOW, "\ufffd")
            .replace(json.dumps(LONE)[1:-1], "\ufffd")
            .replace(json.dumps(LOW)[1:-1], "\ufffd")
        )

    pending = worker.pending and replace(worker.pending, message=fix(worker.pending.message))
    return replace(
        worker,
        message=fix(worker.message),
        log_tail=fix(worker.log_tail),
        context=fix(worker.context),
        pending=pending,
    )


def test_a_huge_log_is_cut_to_its_tail_before_it_is_cleaned() -> None:
    log = f"{LONE}é" * 5_000_000 + f"\n{SHAPE_TRACEBACK} {LOW}"
    d = diagnose_worker(WorkerFacts(exit_code=1, log_tail=log))
    assert d.code is FailureCode.SHAPE_MISMATCH
    all_text(d).encode("utf-8")


def test_encodable_replaces_lone_surrogates_and_keeps_everything_else() -> None:
    assert encodable(f"a{LONE}b{LOW}") == "a\ufffdb\ufffd"
    # A pair of surrogate code points (as a JSON escape pair would give) is one character.
    assert encodable("\ud83d\ude00") == "\U0001f600"
    for fine in ("plain ascii", "naïve 日本 \U0001f600", ""):
        assert encodable(fine) is fine


def test_facts_with_nothing_to_clean_pass_the_gate_unchanged() -> None:
    worker = WorkerFacts(
        exit_code=1, message="naïve", log_tail="x" * 100, pending=PendingFacts("waiting")
    )
    assert encodable_facts(worker) is worker
    cleaned = encodable_facts(replace(worker, pending=PendingFacts(f"w{LONE}")))
    assert cleaned.pending == PendingFacts("w\ufffd")
    assert cleaned.message is worker.message


def test_a_user_pattern_that_is_not_encodable_is_refused_naming_the_rule() -> None:
    rule = UserRule(
        failure_class=FailureClass.FATAL, message_regex=f"bad{LONE}", name="spec.recovery.rules[0]"
    )
    with pytest.raises(RuleTableError, match=r"spec\.recovery\.rules\[0\]"):
        diagnose_worker(WorkerFacts(exit_code=1, log_tail="bad"), user_rules=[rule])
