"""The goodput breakdown: each category on hand-computed runs, and the sum is the wall time."""

from __future__ import annotations

import math

import pytest

from tpujob.plan.goodput_breakdown import (
    AttemptFacts,
    Breakdown,
    GoodputCategory,
    goodput_breakdown,
)

C = GoodputCategory


def seconds(b: Breakdown) -> dict[GoodputCategory, float]:
    return {c: b.seconds(c) for c in GoodputCategory if b.seconds(c)}


# Each case: wall seconds, attempts, the expected seconds per category (the others are 0).
CASES = {
    "one running attempt: start-up, kept steps split by data wait, tail since its last beat": (
        100.0,
        [
            AttemptFacts(
                launched_at=10,
                first_heartbeat_at=30,
                first_step=10,
                last_step=60,
                steps_per_second=1.0,
                input_bound_fraction=0.2,
            )
        ],
        {C.DOWNTIME: 10, C.STARTUP: 10, C.PRODUCTIVE: 48, C.DATA_WAIT: 12, C.OTHER: 20},
    ),
    "a restart: steps past the restored checkpoint and the failure tail are re-done": (
        200.0,
        [
            AttemptFacts(
                launched_at=0,
                first_heartbeat_at=20,
                first_step=10,
                last_step=70,
                steps_per_second=1.0,
                ended_at=90,
                failed=True,
                checkpoint_step=60,
            ),
            AttemptFacts(
                launched_at=100,
                first_heartbeat_at=130,
                first_step=55,
                restored_step=50,
                last_step=120,
                steps_per_second=1.0,
                restore_seconds=5,
            ),
        ],
        {C.STARTUP: 30, C.RESTORE: 5, C.PRODUCTIVE: 120, C.REDONE: 30, C.DOWNTIME: 10, C.OTHER: 5},
    ),
    "a failed attempt before its restart counts the steps past its checkpoint as lost": (
        100.0,
        [
            AttemptFacts(
                launched_at=0,
                first_heartbeat_at=10,
                first_step=0,
                last_step=100,
                steps_per_second=2.0,
                ended_at=70,
                failed=True,
                checkpoint_step=80,
            )
        ],
        {C.STARTUP: 10, C.PRODUCTIVE: 40, C.REDONE: 20, C.DOWNTIME: 30},
    ),
    "an attempt that never reported a step is all start-up": (
        50.0,
        [AttemptFacts(launched_at=5)],
        {C.DOWNTIME: 5, C.STARTUP: 45},
    ),
    "without a reported rate the steps after the first heartbeat set it": (
        100.0,
        # 40 steps in the 70 s after the first heartbeat: 1.75 s a step, training from 12.5 s
        [
            AttemptFacts(
                launched_at=0, first_heartbeat_at=30, first_step=10, last_step=50, ended_at=100
            )
        ],
        {C.STARTUP: 12.5, C.PRODUCTIVE: 87.5},
    ),
    "a succeeded attempt loses nothing; its time after the last step is other": (
        60.0,
        [
            AttemptFacts(
                launched_at=0,
                first_heartbeat_at=10,
                first_step=0,
                last_step=40,
                steps_per_second=1.0,
                ended_at=55,
                checkpoint_step=20,
            )
        ],
        {C.STARTUP: 10, C.PRODUCTIVE: 40, C.DOWNTIME: 5, C.OTHER: 5},
    ),
}


@pytest.mark.parametrize(("wall", "attempts", "expected"), CASES.values(), ids=CASES.keys())
def test_each_category_matches_the_hand_computed_run(
    wall: float, attempts: list[AttemptFacts], expected: dict[GoodputCategory, float]
) -> None:
    breakdown = goodput_breakdown(wall_seconds=wall, attempts=attempts)
    assert seconds(breakdown) == pytest.approx(expected)
    assert breakdown.goodput == pytest.approx(expected.get(C.PRODUCTIVE, 0) / wall)


NAN, INF = math.nan, math.inf
GARBAGE = {
    "non-finite rate and fraction": [
        AttemptFacts(
            launched_at=1,
            first_heartbeat_at=5,
            first_step=3,
            last_step=9,
            steps_per_second=NAN,
            input_bound_fraction=INF,
            ended_at=8.5,
        )
    ],
    "negative and absurd steps": [
        AttemptFacts(
            launched_at=0,
            first_heartbeat_at=2,
            first_step=-4,
            last_step=10**30,
            steps_per_second=1e12,
        )
    ],
    "times outside the wall time": [
        AttemptFacts(
            launched_at=-50, first_heartbeat_at=1e9, first_step=1, last_step=2, ended_at=-3
        )
    ],
    "overlapping attempts out of order": [
        AttemptFacts(
            launched_at=40,
            first_heartbeat_at=41,
            first_step=5,
            restored_step=99,
            last_step=3,
            steps_per_second=0.3,
            ended_at=20,
            failed=True,
        ),
        AttemptFacts(
            launched_at=10,
            first_heartbeat_at=15,
            first_step=0,
            last_step=1000,
            steps_per_second=100.0,
            ended_at=90,
            failed=True,
            checkpoint_step=7,
            restore_seconds=-5,
        ),
    ],
    "a launch that is not a number": [AttemptFacts(launched_at=NAN, first_heartbeat_at=3)],
    "thirds that do not round evenly": [
        AttemptFacts(
            launched_at=1 / 3,
            first_heartbeat_at=2 / 3,
            first_step=1,
            last_step=7,
            steps_per_second=3.0,
            input_bound_fraction=1 / 3,
            ended_at=7 / 3,
            failed=True,
            checkpoint_step=2,
        ),
        AttemptFacts(
            launched_at=8 / 3,
            first_heartbeat_at=3.0,
            first_step=2,
            restored_step=2,
            last_step=9,
            steps_per_second=7.0,
            input_bound_fraction=1 / 7,
        ),
    ],
}


@pytest.mark.parametrize("attempts", GARBAGE.values(), ids=GARBAGE.keys())
@pytest.mark.parametrize("wall", [100.0, 10.0001, 3.3333333])
def test_the_categories_sum_to_the_wall_time_exactly_whatever_the_facts(
    attempts: list[AttemptFacts], wall: float
) -> None:
    breakdown = goodput_breakdown(wall_seconds=wall, attempts=attempts)
    assert breakdown.wall_ms == round(wall * 1000)
    assert sum(breakdown.parts.values()) == breakdown.wall_ms
    assert set(breakdown.parts) == set(GoodputCategory)
    assert all(ms >= 0 for ms in breakdown.parts.values())


@pytest.mark.parametrize("wall", [0.0, -5.0, NAN, INF])
def test_no_wall_time_gives_an_empty_breakdown_and_no_goodput(wall: float) -> None:
    breakdown = goodput_breakdown(wall_seconds=wall, attempts=[AttemptFacts(launched_at=0)])
    assert (breakdown.wall_ms, sum(breakdown.parts.values()), breakdown.goodput) == (0, 0, None)
