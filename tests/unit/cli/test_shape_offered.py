"""The operator's zone catalogue, told on the job: a ShapeOffered condition, read back by
`tpujob describe` and `tpujob doctor` without a catalogue of their own."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import T0, at, job_body, observed, running_status

from tpujob.api import ConditionType, parse_job
from tpujob.console import describe_lines
from tpujob.doctor.checks import Check, Level, Snapshot, examine
from tpujob.gcp.catalogue import Catalogue, Offer
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan

V4_16 = {"us-central2-b": (Offer("v4-16", frozenset({("V4", "2x2x2")})),)}
V6E_ONLY = {"us-east5-b": (Offer("v6e-16", frozenset({("V6E", "4x4")})),)}


def planned(job: dict[str, Any], catalogue: Catalogue | None, now: float = 1) -> Plan:
    return plan(replace(observed(job), catalogue=catalogue), now=at(now))


def status_after(result: Plan) -> dict[str, Any]:
    return result.status.model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.parametrize(
    ("offers", "expected"),
    [
        (V4_16, ("True", "Offered")),
        (V6E_ONLY, ("False", "NotOffered")),
        ({}, None),  # the catalogue could not be read: it says nothing
    ],
    ids=["offered", "offered-nowhere", "unreadable"],
)
def test_the_catalogues_word_on_the_shape_is_a_condition(
    offers: dict[str, tuple[Offer, ...]], expected: tuple[str, str] | None
) -> None:
    result = planned(job_body(status=running_status()), Catalogue(project="p", offers=offers))
    said = result.status.condition(ConditionType.SHAPE_OFFERED)
    assert (None if said is None else (str(said.status), said.reason)) == expected


def test_no_catalogue_sets_no_condition() -> None:
    result = planned(job_body(status=running_status()), None)
    assert result.status.condition(ConditionType.SHAPE_OFFERED) is None


def test_a_shape_offered_nowhere_is_told_once_as_a_warning_event() -> None:
    catalogue = Catalogue(project="p", offers=V6E_ONLY)
    first = planned(job_body(status=running_status()), catalogue)
    told = [e for e in first.events if e.reason == "ShapeNotOffered"]
    assert [e.type for e in told] == ["Warning"]
    assert "v4-16" in told[0].message and "us-east5-b" in told[0].message
    again = planned(job_body(status=status_after(first)), catalogue, now=30)
    assert not [
        e
        for e in again.events
        if e.reason == "ShapeNotOffered" and e.at is not None and e.at > at(1)
    ]


def test_a_finished_job_is_not_judged_again() -> None:
    done = running_status(phase="Succeeded")
    result = planned(job_body(status=done), Catalogue(project="p", offers=V6E_ONLY))
    assert result.status.condition(ConditionType.SHAPE_OFFERED) is None


def told_job(offers: dict[str, tuple[Offer, ...]]) -> dict[str, Any]:
    result = planned(job_body(status=running_status()), Catalogue(project="p", offers=offers))
    return job_body(status=status_after(result))


@pytest.mark.parametrize(("offers", "warned"), [(V6E_ONLY, True), (V4_16, False)])
def test_describe_repeats_the_operators_warning_without_a_catalogue_of_its_own(
    offers: dict[str, tuple[Offer, ...]], warned: bool
) -> None:
    lines = describe_lines(parse_job(told_job(offers)), T0)
    assert (
        any(
            "offered in none of the zones us-east5-b" in line and "the operator's catalogue" in line
            for line in lines
        )
        is warned
    )


@pytest.mark.parametrize(("offers", "level"), [(V6E_ONLY, Level.WARNING), (V4_16, Level.OK)])
def test_doctor_without_a_catalogue_reports_what_the_operators_catalogue_said(
    offers: dict[str, tuple[Offer, ...]], level: Level
) -> None:
    found = [f for f in examine(Snapshot(jobs=[told_job(offers)])) if f.check is Check.CATALOGUE]
    assert [(f.subject, f.level) for f in found] == [("job team/train", level)]
    assert all("the operator's catalogue" in f.message for f in found)


def test_doctor_with_no_catalogue_anywhere_says_how_to_configure_one() -> None:
    found = [f for f in examine(Snapshot(jobs=[job_body()])) if f.check is Check.CATALOGUE]
    assert [f.level for f in found] == [Level.INFO]
    assert "catalogue.*" in found[0].action
