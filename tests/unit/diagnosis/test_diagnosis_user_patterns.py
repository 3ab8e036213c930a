"""A job's rule patterns are compiled once and kept, keyed by their text, within a bound.

Asserted on what is compiled and found, never on time: repeated diagnoses of a job give what
they gave before, and compile its pattern once.
"""

from __future__ import annotations

import pytest

from tpujob.diagnosis import (
    FailureClass,
    FailureCode,
    RuleTableError,
    UserRule,
    WorkerFacts,
    diagnose_worker,
    rules,
)

OOM_LOG = "step 10\nmy_lib: custom allocator gave up after 3 tries\n"


def oom_rule(name: str, pattern: str = r"allocator gave up after \d+ tries") -> UserRule:
    return UserRule(
        failure_class=FailureClass.SOFT, code=FailureCode.HOST_OOM, message_regex=pattern, name=name
    )


@pytest.fixture
def empty_cache() -> None:
    rules._compiled_user_pattern.cache_clear()


@pytest.mark.usefixtures("empty_cache")
def test_repeated_diagnoses_of_a_job_compile_its_pattern_once_and_agree() -> None:
    worker = WorkerFacts(exit_code=1, log_tail=OOM_LOG)
    first = diagnose_worker(worker, user_rules=[oom_rule("spec.recovery.rules[0]")])
    again = [
        diagnose_worker(worker, user_rules=[oom_rule("spec.recovery.rules[0]")]) for _ in range(5)
    ]
    assert all(d == first for d in again)
    assert (first.rule, first.code, first.failure_class) == (
        "spec.recovery.rules[0]",
        FailureCode.HOST_OOM,
        FailureClass.SOFT,
    )
    info = rules._compiled_user_pattern.cache_info()
    assert (info.misses, info.hits) == (1, 5)


@pytest.mark.usefixtures("empty_cache")
def test_rules_sharing_a_pattern_share_the_compilation_but_keep_their_names() -> None:
    worker = WorkerFacts(exit_code=1, log_tail=OOM_LOG)
    a = diagnose_worker(worker, user_rules=[oom_rule("job-a rule")])
    b = diagnose_worker(worker, user_rules=[oom_rule("job-b rule")])
    assert (a.rule, b.rule) == ("job-a rule", "job-b rule")
    assert b.evidence[0].detail.startswith("job-b rule: ")
    miss = diagnose_worker(
        WorkerFacts(exit_code=1, log_tail="step 10\n"), user_rules=[oom_rule("job-a rule")]
    )
    assert miss.rule != "job-a rule"
    assert rules._compiled_user_pattern.cache_info().misses == 1


@pytest.mark.usefixtures("empty_cache")
def test_a_refused_pattern_is_not_kept_and_names_each_rule_that_uses_it() -> None:
    worker = WorkerFacts(exit_code=1, log_tail=OOM_LOG)
    for name in ("first", "second"):
        with pytest.raises(RuleTableError, match=f"^{name}: "):
            diagnose_worker(worker, user_rules=[oom_rule(name, pattern="(a)\\1")])
    assert rules._compiled_user_pattern.cache_info().currsize == 0


@pytest.mark.usefixtures("empty_cache")
def test_the_kept_patterns_are_bounded() -> None:
    for i in range(rules.USER_PATTERNS_KEPT + 10):
        rules.user_pattern(f"pattern number {i}", "test")
    info = rules._compiled_user_pattern.cache_info()
    assert info.maxsize == rules.USER_PATTERNS_KEPT
    assert info.currsize == rules.USER_PATTERNS_KEPT
