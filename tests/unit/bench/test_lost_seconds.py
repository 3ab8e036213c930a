"""A fault's lost seconds cut from the trainers' log lines (bench/lost_seconds.py)."""

from __future__ import annotations

from datetime import datetime

import pytest
from bench.fault_timeline import PodWrites
from bench.lost_seconds import Line, Mark, breakdown, parse, seconds_per_step

T0 = datetime(2026, 12, 6, 12, 0, 0).timestamp()


def stamp(seconds: float) -> str:
    moment = datetime.fromtimestamp(T0 + seconds)
    return moment.strftime("%Y-%m-%d %H:%M:%S,") + f"{moment.microsecond // 1000:03d}"


def log(*entries: tuple[float, str]) -> str:
    return "\n".join(f"{stamp(at)} INFO tpujob_trainer: {message}" for at, message in entries)


def process_log(process: int, *, steps_until: float, back_at: float | None) -> str:
    """A process stepping 10 steps a second from t=1 to `steps_until`, and, when `back_at` is
    set, started again there: joined, restored step 20 in 0.5 s two seconds later, stepping
    one second after that."""
    entries = [
        (0.0, f"joining job: process {process} of 2, coordinator c:1, heartbeat timeout 60s")
    ]
    entries += [
        (1 + i / 10, f"step {i + 1}/1000 loss=1.0 steps_per_s=10.00")
        for i in range(int((steps_until - 1) * 10))
    ]
    if back_at is not None:
        entries += [
            (
                back_at,
                f"joining job: process {process} of 2, coordinator c:1, heartbeat timeout 60s",
            ),
            (back_at + 2, "restored step 20 from the local tier in 0.50s"),
            (back_at + 3, "step 21/1000 loss=1.0 steps_per_s=1.00"),
        ]
    return log(*entries)


def test_a_supervisors_log_gives_each_line_the_process_that_joined_before_it() -> None:
    text = log(
        (0.0, "supervisor starting"),
        (1.0, "joining job: process 3 of 4, coordinator c:1, heartbeat timeout 60s"),
        (2.0, "step 1/10 loss=1.0 steps_per_s=1.00"),
        (3.0, "joining job: process 1 of 4, coordinator c:1, heartbeat timeout 60s"),
        (4.0, "restored step 40 from the peer tier in 0.25s"),
        (5.0, "resumed from step 40 state_digest=abc"),
    )
    lines = parse(text + "\nnot a log line step 9/10 ")
    assert [(ln.process, ln.mark, ln.step, ln.seconds) for ln in lines] == [
        (3, Mark.JOINED, None, None),
        (3, Mark.STEP, 1, None),
        (1, Mark.JOINED, None, None),
        (1, Mark.RESTORED, 40, 0.25),
        (1, Mark.RESTORED, 40, None),
    ]
    assert lines[1].at - lines[0].at == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("back_at", "reaction", "expected"),
    [
        # Both processes back at 30 s: the fault at 25.05 s (step 240 done) restored step 20.
        (
            (30.0, 30.0),
            27.0,
            {
                "detect_s": 1.95,
                "restart_s": 3.0,
                "start_up_s": 1.5,
                "restore_s": 0.5,
                "first_step_s": 1.0,
                "redone_steps": 220,
                "redone_s": 22.0,
            },
        ),
        # The last process back decides; no watch: detection is folded into the restart.
        (
            (30.0, 34.0),
            None,
            {
                "detect_s": None,
                "restart_s": 8.95,
                "start_up_s": 1.5,
                "restore_s": 0.5,
                "first_step_s": 1.0,
                "redone_steps": 220,
                "redone_s": 22.0,
            },
        ),
    ],
    ids=["watched-reaction", "last-process-decides"],
)
def test_a_faults_seconds_are_cut_at_the_worlds_milestones(
    back_at: tuple[float, float], reaction: float | None, expected: dict[str, object]
) -> None:
    lines = [
        ln for p in (0, 1) for ln in parse(process_log(p, steps_until=25.0, back_at=back_at[p]))
    ]
    pace = seconds_per_step(lines)
    assert pace == pytest.approx(0.1, abs=0.002)
    lost = breakdown(
        lines, T0 + 25.05, T0 + 100, 2, 0.1, reaction_at=None if reaction is None else T0 + reaction
    )
    assert lost is not None
    got = lost.as_dict()
    assert {k: got[k] for k in expected} == pytest.approx(expected, abs=0.02)
    parts = [
        got[k] or 0
        for k in ("detect_s", "restart_s", "start_up_s", "restore_s", "first_step_s", "redone_s")
    ]
    assert got["lost_s"] == pytest.approx(sum(parts), abs=0.02)  # type: ignore[arg-type]


def test_a_fault_not_recovered_before_the_next_has_no_breakdown() -> None:
    lines = parse(process_log(0, steps_until=25.0, back_at=30.0))
    lines += parse(process_log(1, steps_until=25.0, back_at=None))
    assert breakdown(lines, T0 + 25.05, T0 + 100, 2, 0.1) is None
    # Both back, but the next fault came before the first step.
    both = lines + parse(process_log(1, steps_until=0.0, back_at=30.0))
    assert breakdown(both, T0 + 25.05, T0 + 32.5, 2, 0.1) is None
    assert breakdown(both, T0 + 25.05, T0 + 34, 2, 0.1) is not None


def test_a_process_started_twice_counts_from_its_last_start() -> None:
    lines = [
        Line(T0 + 11, 0, Mark.JOINED),
        Line(T0 + 12, 0, Mark.JOINED),
        Line(T0 + 15, 0, Mark.RESTORED, 20, 1.0),
        Line(T0 + 16, 0, Mark.STEP, 21),
    ]
    lost = breakdown(lines, T0 + 10, T0 + 60, 1, 0.1)
    assert lost is not None
    assert (lost.restart_s, lost.start_up_s, lost.restore_s, lost.first_step_s) == (
        2.0,
        2.0,
        1.0,
        1.0,
    )


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # (kind, uid, deleting, rejoin order, at)
        ([("ADDED", "a", False, None, 1.0)], [1.0]),
        ([("ADDED", "a", False, None, 1.0), ("MODIFIED", "a", False, None, 5.0)], [1.0]),
        ([("ADDED", "a", False, None, 1.0), ("MODIFIED", "a", True, None, 5.0)], [1.0, 5.0]),
        (
            [
                ("ADDED", "a", False, None, 1.0),
                ("MODIFIED", "a", True, None, 5.0),
                ("MODIFIED", "a", True, None, 6.0),
                ("DELETED", "a", True, None, 7.0),
            ],
            [1.0, 5.0],
        ),
        (
            [("ADDED", "a", False, None, 1.0), ("MODIFIED", "a", False, '{"attempt":2}', 5.0)],
            [1.0, 5.0],
        ),
    ],
    ids=["created", "status-only", "marked-for-deletion", "marked-once", "rejoin-ordered"],
)
def test_only_a_controllers_writes_to_pods_count_as_its_reaction(
    events: list[tuple[str, str, bool, str | None, float]], expected: list[float]
) -> None:
    writes = PodWrites()
    for event in events:
        writes.note(*event)
    assert writes.times == expected
    assert writes.reaction_after(1.0) == (expected[1] if len(expected) > 1 else None)
