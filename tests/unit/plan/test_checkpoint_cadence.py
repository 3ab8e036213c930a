"""Checkpoint cadence advice: the Young/Daly optimum, and the CheckpointCadence condition a
running job gets from its measured save cost, rate and restarts."""

from __future__ import annotations

import math

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, running_status

from tpujob.api import ConditionType, contract, parse_job
from tpujob.plan.checkpoint_cadence import young_daly
from tpujob.plan.planner import plan

BUCKET = "gs://bucket/ckpt"


def expected_loss(interval: float, save: float, mtbf: float) -> float:
    """The fraction of time lost to saves and to the redone work of failures (first order)."""
    return save / interval + (interval + save) / (2 * mtbf)


@pytest.mark.parametrize(
    ("save", "mtbf"), [(1.0, 3600.0), (10.0, 3600.0), (0.2, 600.0), (60.0, 86400.0), (30.0, 600.0)]
)
def test_the_optimum_is_youngs_for_cheap_saves_and_near_the_least_loss(
    save: float, mtbf: float
) -> None:
    optimum = young_daly(save, mtbf)
    young = math.sqrt(2 * save * mtbf)
    if save / mtbf < 0.01:
        assert optimum == pytest.approx(young, rel=0.05)
    grid = [young * k / 100 for k in range(20, 400)]
    best = min(expected_loss(t, save, mtbf) for t in grid)
    assert expected_loss(optimum, save, mtbf) <= best * 1.05


def test_a_save_as_long_as_two_failure_gaps_saves_once_per_gap() -> None:
    assert young_daly(500.0, 200.0) == 200.0


def cadence(
    *,
    now: float = 7200,
    restarts: int = 2,
    interval: int = 100,
    sps: float = 2.0,
    save: str | None = "1.0",
    attempt: int = 1,
) -> tuple[str, str, str] | None:
    """(status, reason, message) of the CheckpointCadence condition planned at `now` seconds
    after the job started, or None when none is set."""
    status = running_status(restarts={"soft": restarts})
    job = job_body(status=status, checkpoint={"uri": BUCKET, "intervalSteps": interval})
    beat = lease(renewed=now - 1, step=500, attempt=attempt, sps=sps)
    if save is not None:
        beat["metadata"]["annotations"][contract.HEARTBEAT_SAVE_SECONDS] = save
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    result = plan(observed(job, pods, heartbeat=beat), now=at(now))
    found = result.status.condition(ConditionType.CHECKPOINT_CADENCE)
    if found is None:
        return None
    return str(found.status), str(found.reason), str(found.message)


# A 1 s save and a restart every hour: the optimum is ~84 s of training, 168 steps at 2 steps/s.
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ({"interval": 100}, ("True", "NearOptimum")),
        ({"interval": 20}, ("False", "SavesTooOften")),
        ({"interval": 1000}, ("False", "SavesTooRarely")),
        # No failure in two hours: the optimum is at least ~120 s; too often can be told.
        ({"restarts": 0, "interval": 20}, ("False", "SavesTooOften")),
        ({"restarts": 0, "interval": 1000}, ("True", "NoFailureYet")),
    ],
    ids=["near", "too-often", "too-rarely", "no-failure-too-often", "no-failure-not-too-often"],
)
def test_a_running_job_is_told_how_its_interval_compares_with_the_optimum(
    case: dict[str, int], expected: tuple[str, str]
) -> None:
    said = cadence(**case)
    assert said is not None and said[:2] == expected


def test_the_advice_names_the_interval_to_set() -> None:
    said = cadence(interval=20)
    assert said is not None
    assert "costs 1.00s a save" in said[2]
    assert "2 restart(s) in 2.0h (one every ~60m)" in said[2]
    assert "set spec.checkpoint.intervalSteps to about 168" in said[2]


@pytest.mark.parametrize(
    "case",
    [
        {"now": 300},  # too early in the job's life
        {"save": None},  # no save measured yet
        {"save": "0"},
        {"sps": 0.0},
        {"attempt": 0},  # an earlier attempt's beat
    ],
    ids=["too-early", "no-save-yet", "free-save", "no-rate", "earlier-attempt"],
)
def test_nothing_is_said_without_the_numbers_to_judge_by(case: dict[str, float]) -> None:
    assert cadence(**case) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("interval", "shown"),
    [(100, "  cadence    saving every 100 steps"), (20, "  CheckpointCadence  SavesTooOften: ")],
    ids=["met-on-its-own-line", "unmet-with-the-false-conditions"],
)
def test_describe_shows_the_advice(interval: int, shown: str) -> None:
    from tpujob.console import describe_lines

    status = running_status(restarts={"soft": 2})
    body = job_body(status=status, checkpoint={"uri": BUCKET, "intervalSteps": interval})
    beat = lease(renewed=7199, step=500, sps=2.0)
    beat["metadata"]["annotations"][contract.HEARTBEAT_SAVE_SECONDS] = "1.0"
    planned = plan(
        observed(body, [pod(body, 1, 0, 0), pod(body, 1, 0, 1)], heartbeat=beat), now=at(7200)
    )
    job = parse_job({**body, "status": planned.status.model_dump(mode="json", by_alias=True)})
    assert any(line.startswith(shown) for line in describe_lines(job, at(7200)))
