"""Site rules: the cluster's regrades, their format, and where they decide."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tpujob.diagnosis import (
    FailureClass,
    JobFacts,
    SiteRulesError,
    Source,
    UserRule,
    WorkerFacts,
    diagnose_job,
    diagnose_worker,
    parse_site_rules,
)

XID = "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."
FUSE = "OSError: [Errno 107] Transport endpoint is not connected: '/gcs/data/shard-3'"


def rule(**fields: Any) -> dict[str, Any]:
    return {"name": "r", "class": "soft", "why": "known", "set": "2026-12-01", **fields}


def test_site_rule_by_message_decides_before_the_catalogues_and_says_who_set_it_when_why() -> None:
    rules = parse_site_rules(
        {
            "version": 1,
            "rules": [
                rule(
                    name="lab-gpu-resets",
                    why="our GPUs are reset by the driver watchdog",
                    message_regex="fallen off the bus",
                    set_by="platform",
                )
            ],
        }
    )
    plain = diagnose_worker(WorkerFacts(log_tail=XID), model=None)
    regraded = diagnose_worker(WorkerFacts(log_tail=XID), site_rules=rules, model=None)
    note = "site rule 'lab-gpu-resets', set 2026-12-01: our GPUs are reset by the driver watchdog"
    assert plain.failure_class is FailureClass.HARD
    assert (regraded.failure_class, regraded.rule) == (FailureClass.SOFT, "site:lab-gpu-resets")
    assert note in regraded.summary
    assert regraded.evidence[0].source is Source.SITE_RULE
    assert regraded.evidence[0].detail.startswith(note)
    assert regraded.signature == plain.signature  # the same failure, regraded


def test_site_rule_by_signature_regrades_the_same_failure_in_another_job() -> None:
    first = diagnose_worker(WorkerFacts(log_tail=FUSE), model=None)
    rules = parse_site_rules({"rules": [rule(name="fuse", signature=first.signature)]})
    other_job = diagnose_job(
        JobFacts(workers=(WorkerFacts(log_tail=FUSE, worker_index=3),)), site_rules=rules
    )
    assert (other_job.failure_class, other_job.rule) == (FailureClass.SOFT, "site:fuse")
    unrelated = diagnose_worker(WorkerFacts(log_tail=XID), site_rules=rules, model=None)
    assert unrelated.rule != "site:fuse"


def test_the_jobs_own_rule_outranks_a_site_rule() -> None:
    site = parse_site_rules({"rules": [rule(message_regex="fallen off")]})
    own = UserRule(failure_class=FailureClass.FATAL, message_regex="fallen off", name="mine")
    diagnosis = diagnose_worker(
        WorkerFacts(log_tail=XID), user_rules=[own], site_rules=site, model=None
    )
    assert (diagnosis.rule, diagnosis.failure_class) == ("mine", FailureClass.FATAL)


def test_site_rule_on_exit_codes_needs_every_condition() -> None:
    site = parse_site_rules({"rules": [rule(exit_codes=[42], reasons=["Error"])]})
    both = WorkerFacts(exit_code=42, reason="Error", log_tail="x")
    one = WorkerFacts(exit_code=42, reason="OOMKilled", log_tail="x")
    assert diagnose_worker(both, site_rules=site, model=None).rule == "site:r"
    assert diagnose_worker(one, site_rules=site, model=None).rule != "site:r"


def test_site_rule_set_parses_dates_from_yaml_and_empty_documents() -> None:
    (parsed,) = parse_site_rules({"rules": [rule(set=dt.date(2026, 12, 1), signature="X:1")]})
    assert parsed.set_on == dt.date(2026, 12, 1)
    assert parse_site_rules(None) == ()


@pytest.mark.parametrize(
    "data",
    [
        {"rules": [rule(message_regex="(?<=a)b")]},
        {"rules": [rule(message_regex="(unclosed")]},
        {"rules": [rule(set="last tuesday", signature="X:1")]},
        {"rules": [{"name": "r", "class": "soft", "set": "2026-12-01", "signature": "X:1"}]},
        {"rules": [rule(**{"class": "catastrophic"}, signature="X:1")]},
        {"rules": [rule(colour="red", signature="X:1")]},
        {"rules": [rule()]},
        {"rules": [rule(signature="X:1", exit_codes=[1])]},
        {"rules": [rule(signature="X:1"), rule(signature="X:2")]},
        {"version": 2, "rules": []},
        {"rules": {"r": {}}},
    ],
    ids=[
        "pattern-re2-cannot-run",
        "pattern-does-not-compile",
        "not-a-date",
        "no-why",
        "unknown-class",
        "unknown-key",
        "nothing-to-match",
        "signature-with-conditions",
        "names-repeat",
        "unknown-version",
        "rules-not-a-list",
    ],
)
def test_malformed_site_rule_set_is_refused_whole(data: Any) -> None:
    with pytest.raises(SiteRulesError):
        parse_site_rules(data)
