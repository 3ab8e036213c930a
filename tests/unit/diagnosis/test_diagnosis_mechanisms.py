"""Mechanisms, not phrasings: exceptions, status words, Kubernetes language; RE2 safety."""

from __future__ import annotations

import pytest

from tpujob.diagnosis import FailureClass, RuleTableError, UserRule, WorkerFacts, diagnose_worker
from tpujob.diagnosis.exceptions import grade_exception, last_exception
from tpujob.diagnosis.rules import compile_pattern

S, M, H, F = FailureClass.SOFT, FailureClass.MEDIUM, FailureClass.HARD, FailureClass.FATAL

CASES = [
    ("last-exception-wins", "KeyError: 'x'\nDuring handling...\nTypeError: bad operand", F),
    ("wrapper-graded-by-unavailable", "XlaRuntimeError: UNAVAILABLE: connection lost", S),
    ("wrapper-graded-by-deadline", "JaxRuntimeError: DEADLINE_EXCEEDED: rpc", M),
    ("wrapper-graded-by-not-found", "RuntimeError: NOT_FOUND: no such thing", F),
    ("tf-spelling-of-status", "(0) Aborted: remote session gone", S),
    ("http-429-is-backoff", "HTTPError: 429 Client Error: Too Many Requests", M),
    ("http-503-is-transient", "HTTPError: 503 Server Error: Service Unavailable", S),
    ("node-not-ready", "Warning NodeNotReady pod/w-0 Node is not ready", H),
    ("kubelet-outofcpu", "Status: Failed Reason: OutOfcpu Message: Pod Node didn't have enough", S),
    ("admission-device", "UnexpectedAdmissionError: Allocate failed due to no healthy devices", H),
    ("evicted-pressure", "Reason: Evicted Message: The node was low on resource: memory.", S),
    ("image-not-found", 'Failed to pull image "x:v9": manifest unknown', F),
    (
        "image-registry-timeout",
        "ErrImagePull: Get https://r/v2/: net/http: TLS handshake timeout",
        M,
    ),
    ("missing-secret", 'Error: CreateContainerConfigError: secret "hf-token" not found', F),
    (
        "ib-completion-error",
        "NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> with error 12",
        H,
    ),
    ("version-requires", "RuntimeError: this libtpu version requires jax >= 0.4.30", F),
    ("nan-grad", "found NaN in local grad norm for bucket #0", F),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_failure_is_graded_by_its_mechanism(text: str, expected: FailureClass) -> None:
    assert diagnose_worker(WorkerFacts(log_tail=text), model=None).failure_class is expected


def test_last_exception_is_the_one_raised_last() -> None:
    raised = last_exception("ValueError: first\n  File x\nzoo.BarError: second")
    assert raised is not None
    assert raised.type_name == "BarError"
    assert raised.line == "BarError: second"


def test_text_without_exception_or_status_is_not_graded() -> None:
    assert grade_exception("the job stopped, no idea why") is None


@pytest.mark.timeout(20)
def test_catastrophic_user_pattern_finishes_in_linear_time() -> None:
    rule = UserRule(failure_class=FailureClass.FATAL, message_regex="(a|aa)+$", name="evil")
    facts = WorkerFacts(exit_code=1, log_tail="a" * 80 + "!")
    diagnosis = diagnose_worker(facts, user_rules=[rule], model=None)
    assert diagnosis.rule != "evil"  # `$` needs the end right after the a's: no match


@pytest.mark.timeout(20)
def test_catastrophic_user_pattern_still_matches_when_it_should() -> None:
    rule = UserRule(failure_class=FailureClass.FATAL, message_regex="(a|aa)+$", name="evil")
    diagnosis = diagnose_worker(WorkerFacts(log_tail="a" * 80), user_rules=[rule], model=None)
    assert (diagnosis.rule, diagnosis.failure_class) == ("evil", FailureClass.FATAL)


@pytest.mark.parametrize("pattern", ["(?<=a)b", "(a)\\1", "x(?=y)"])
def test_pattern_re2_cannot_run_is_refused_naming_where(pattern: str) -> None:
    with pytest.raises(RuleTableError, match="user rule evil"):
        compile_pattern(pattern, "user rule evil")
