"""A regrade becomes a site rule the operator reads and every later failure is graded by."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import replace
from typing import Any

import pytest
import yaml
from tests.unit.builders import at, job_body, observed, pod, running_status
from tests.unit.fakes import FakeReader, RecordingWriter, deps_for

from tpujob.controller.sweeps import read_site_rules
from tpujob.diagnosis.site import (
    SITE_RULES_CONFIGMAP,
    SITE_RULES_KEY,
    SiteRulesError,
    parse_site_rules,
)
from tpujob.observed.views import Observed
from tpujob.plan import plan
from tpujob.regrade import RegradeError, site_rule, with_rule

TODAY = dt.date(2026, 12, 3)
STORAGE_LOG = "OSError: [Errno 107] Transport endpoint is not connected: '/gcs/ckpt/step_40'"


def failed_job(history: list[dict[str, Any]]) -> dict[str, Any]:
    return job_body(status={**running_status(attempt=2), "failureHistory": history})


def failure_of(job: dict[str, Any]) -> Observed:
    """What the planner observes of a worker of `job` failing with STORAGE_LOG."""
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=1)]
    return observed(job, pods, logs={"train-1-0-1": STORAGE_LOG})


def test_a_regrade_names_the_last_failure_by_its_signature() -> None:
    job = failed_job([{"signature": "A:1", "code": "X"}, {"signature": "B:2", "code": "HANG"}])
    rule = site_rule(job, "fatal", "always our bug", name=None, today=TODAY)
    assert rule["signature"] == "B:2"
    assert (rule["class"], rule["code"], rule["set"]) == ("fatal", "HANG", "2026-12-03")
    assert rule["name"].startswith("team-train-")


def test_a_job_without_a_recorded_failure_cannot_be_regraded() -> None:
    with pytest.raises(RegradeError):
        site_rule(failed_job([]), "fatal", "why", name=None, today=TODAY)


def test_a_second_regrade_of_the_same_failure_replaces_the_first() -> None:
    first = {"name": "a", "class": "soft", "why": "x", "set": "2026-12-01", "signature": "S:1"}
    other = {"name": "b", "class": "hard", "why": "y", "set": "2026-12-01", "signature": "S:2"}
    again = {**first, "name": "c", "class": "fatal"}
    document = with_rule(with_rule({}, first), other)
    assert [r["name"] for r in with_rule(document, again)["rules"]] == ["b", "c"]
    with pytest.raises(SiteRulesError):
        with_rule(document, {**again, "class": "dreadful"})


def test_the_operator_grades_the_same_failure_in_another_job_by_the_site_rule() -> None:
    # Job one fails; its failure, as the planner recorded it, is regraded fatal.
    one = job_body(status=running_status())
    recorded = plan(failure_of(one), now=at(20)).status.failure_history[-1]
    assert recorded.signature
    rule = site_rule(
        failed_job([recorded.model_dump(by_alias=True)]),
        "fatal",
        "the mount is ours",
        name="gcs",
        today=TODAY,
    )
    document = yaml.safe_dump(with_rule({}, rule))
    reader = FakeReader([])
    reader.configs[("ops", SITE_RULES_CONFIGMAP)] = {SITE_RULES_KEY: document}  # type: ignore[attr-defined]
    deps = deps_for(reader, RecordingWriter(), ledger_namespace="ops")
    asyncio.run(read_site_rules(deps))
    assert [r.name for r in deps.site_rules] == ["gcs"]
    # Another job, the same failure: graded by the site rule, which says so.
    other = job_body(status=running_status())
    other["metadata"] = {**other["metadata"], "namespace": "team-b", "uid": "other-uid"}
    obs = failure_of(other)
    result = plan(replace(obs, site_rules=deps.site_rules), now=at(20))
    assert result.diagnosis is not None
    assert result.diagnosis.failure_class.value == "fatal"
    assert "site rule 'gcs', set 2026-12-03: the mount is ours" in str(result.diagnosis.evidence)


def test_a_site_rule_set_that_does_not_parse_leaves_the_last_good_one_in_force() -> None:
    reader = FakeReader([])
    reader.configs[("ops", SITE_RULES_CONFIGMAP)] = {SITE_RULES_KEY: "rules: [{name: x}]"}  # type: ignore[attr-defined]
    deps = deps_for(reader, RecordingWriter(), ledger_namespace="ops")
    good = {"name": "g", "class": "soft", "why": "w", "set": "2026-12-01", "signature": "S:1"}
    kept = deps.site_rules = parse_site_rules(with_rule({}, good))
    asyncio.run(read_site_rules(deps))
    assert deps.site_rules == kept and len(kept) == 1
