"""What happens around a step, for every loop: the step driver with fakes for what it drives.

The saver, the heartbeat, the clock, the sleeps and the health gather are all in memory, so
these tests run no framework; the loops' own tests run the driver inside real processes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from tpujob_trainer.config import TrainerConfig, load_config
from tpujob_trainer.faults import Fault, FaultKind, parse_faults
from tpujob_trainer.heartbeat import Progress
from tpujob_trainer.loss_guard import NonFiniteLossError
from tpujob_trainer.rollback import SkipWindow
from tpujob_trainer.runtime import Loop
from tpujob_trainer.step_driver import StepDriver

pytestmark = pytest.mark.trainer


@dataclass
class FakeSaver:
    """Saves start at once and commit when waited for (as orbax's async saves may)."""

    committed: int | None = None
    saved: list[int] = field(default_factory=list)
    states: list[Any] = field(default_factory=list)
    waits: int = 0
    closed: bool = False
    refuse: bool = False  # fencing said skip

    def save(self, step: int, state: Any) -> bool:
        if self.refuse:
            return False
        self.saved.append(step)
        self.states.append(state)
        return True

    def committed_step(self) -> int | None:
        return self.committed

    def wait(self) -> int | None:
        self.waits += 1
        if self.saved:
            self.committed = self.saved[-1]
        return self.committed

    def close(self) -> int | None:
        self.closed = True
        return self.wait()


@dataclass
class FakeHeartbeat:
    published: list[Progress] = field(default_factory=list)
    stopped: bool = False

    def progress(self, progress: Progress) -> None:
        self.published.append(progress)

    def stop(self) -> None:
        self.stopped = True


@dataclass
class FakeTime:
    """A clock that moves only when something sleeps or the test advances it."""

    now: float = 100.0
    slept: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@dataclass
class FakeGather:
    """The health all-gather of a one-worker job, recording every row."""

    rows: list[list[float]] = field(default_factory=list)

    def __call__(self, row: Sequence[float]) -> list[list[float]]:
        self.rows.append(list(row))
        return [list(row)]


@dataclass
class Run:
    loop: Loop
    driver: StepDriver
    saver: FakeSaver | None
    heartbeat: FakeHeartbeat
    time: FakeTime
    gather: FakeGather
    stepped: list[int] = field(default_factory=list)
    faults_seen: list[Fault | None] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)


def config(*argv: str, **changes: Any) -> TrainerConfig:
    return replace(load_config(["--checkpoint-interval", "4", *argv], {}), **changes)


def start_run(
    cfg: TrainerConfig,
    *,
    saver: FakeSaver | None = None,
    health: bool = False,
    restored: int | None = None,
) -> Run:
    loop = Loop(cfg)
    loop.context = replace(loop.context, checkpoint_step=restored)
    fake_time, gather, heartbeat = FakeTime(), FakeGather(), FakeHeartbeat()
    driver = StepDriver(
        loop,
        saver=saver,
        heartbeat=heartbeat,
        health=health,
        gather=gather,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
    )
    return Run(loop, driver, saver, heartbeat, fake_time, gather)


def train(
    run: Run,
    start: int = 0,
    *,
    sigterm_at: int | None = None,
    losses: dict[int, float] | None = None,
    data_seconds: float = 0.0,
    step_seconds: float = 0.0,
) -> None:
    """Step `run` as a loop does; a SIGTERM reaches the worker during step `sigterm_at`."""

    def make(index: int, fault: Fault | None) -> int:
        run.time.now += data_seconds
        run.indexes.append(index)
        run.faults_seen.append(fault)
        return index

    for step in run.driver.steps(start):
        run.driver.batch(step, make)
        run.time.now += step_seconds
        if step == sigterm_at:
            run.loop.stop_requested.set()
        run.stepped.append(step)
        loss = (losses or {}).get(step, 1.0 / step)
        run.driver.after(step, loss, f"state-{step}", stop=run.loop.stop_requested.is_set)


@pytest.mark.parametrize(
    ("start", "sigterm_at", "stepped", "saved", "waits"),
    [
        (0, None, range(1, 11), [4, 8, 10], 1),
        (0, 6, range(1, 7), [4, 6], 2),
        (0, 8, range(1, 9), [4, 8], 2),
        (8, None, [9, 10], [10], 1),
        (10, None, [], [], 1),
        (0, 10, range(1, 11), [4, 8, 10], 2),
    ],
    ids=[
        "on-the-interval-and-at-the-last-step",
        "a-sigterm-saves-the-step-reached-and-stops-after-it",
        "a-sigterm-on-an-interval-step-saves-it-once",
        "a-resumed-run-trains-the-steps-after-its-checkpoint",
        "a-run-resumed-at-its-last-step-trains-nothing",
        "a-sigterm-at-the-last-step-stops-as-a-preemption",
    ],
)
def test_saves_fall_on_the_interval_the_last_step_and_a_stop(
    start: int, sigterm_at: int | None, stepped: Sequence[int], saved: list[int], waits: int
) -> None:
    run = start_run(config("--steps", "10"), saver=FakeSaver())
    train(run, start, sigterm_at=sigterm_at)
    run.driver.finish()
    assert run.saver is not None
    assert run.stepped == list(stepped)
    assert run.saver.saved == saved
    assert run.saver.states == [f"state-{s}" for s in saved]
    assert run.saver.waits == waits  # close, and the stop's own wait
    assert run.saver.closed
    assert run.driver.stopping is (sigterm_at is not None)
    assert run.loop.context.step == (run.stepped[-1] if run.stepped else None)
    assert run.loop.context.checkpoint_step == (saved[-1] if saved else None)


@pytest.mark.parametrize(
    ("refuse", "restored", "expected"),
    [(False, None, 5), (True, None, None), (True, 3, 3)],
    ids=[
        "the-stop-s-save-commits-and-is-named",
        "a-fenced-off-save-names-none",
        "or-the-restored-step",
    ],
)
def test_the_context_names_the_newest_committed_step(
    refuse: bool, restored: int | None, expected: int | None
) -> None:
    saver = FakeSaver(refuse=refuse)
    run = start_run(config("--steps", "10"), saver=saver, restored=restored)
    train(run, sigterm_at=5)
    assert run.loop.context.checkpoint_step == expected
    assert run.heartbeat.published[-1].checkpoint_step == expected


@pytest.mark.parametrize(
    ("bad", "saver", "restored", "checkpoint_step", "waits"),
    [
        (math.nan, FakeSaver(), None, 4, 1),
        (math.inf, FakeSaver(), None, 4, 1),
        (math.nan, FakeSaver(refuse=True), 3, 3, 1),
        (math.nan, None, 3, 3, 0),
    ],
    ids=[
        "nan-waits-for-the-pending-save-and-names-it",
        "inf-likewise",
        "nothing-saved-since-the-restore-names-the-restored-step",
        "without-checkpoints-the-restored-step",
    ],
)
def test_a_bad_loss_stops_the_run_at_its_step_naming_the_last_committed_step(
    bad: float, saver: FakeSaver | None, restored: int | None, checkpoint_step: int, waits: int
) -> None:
    run = start_run(config("--steps", "10"), saver=saver, restored=restored)
    with pytest.raises(NonFiniteLossError) as raised:
        train(run, losses={6: bad})
    assert raised.value.step == 6
    assert run.loop.context.step == 6
    assert run.loop.context.checkpoint_step == checkpoint_step
    assert [p.step for p in run.heartbeat.published] == [1, 2, 3, 4, 5]  # never the bad step
    if saver is not None:
        assert saver.waits == waits
        assert 6 not in saver.saved


@pytest.mark.parametrize(
    ("faults", "skip", "attempt", "fault_at", "indexes"),
    [
        ("", (), 0, {}, [1, 2, 3, 4]),
        ("nan@3", (), 0, {3: FaultKind.NAN}, [1, 2, 3, 4]),
        ("shape@2", (), 0, {2: FaultKind.SHAPE}, [1, 2, 3, 4]),
        ("shape@2:worker=1", (), 0, {}, [1, 2, 3, 4]),
        ("nan@3:attempt=1", (), 0, {}, [1, 2, 3, 4]),
        ("nan@3:attempt=1", (), 1, {3: FaultKind.NAN}, [1, 2, 3, 4]),
        ("", (SkipWindow(after_step=2, batches=5),), 0, {}, [1, 2, 8, 9]),
    ],
    ids=[
        "no-fault",
        "nan-handed-to-the-loop-at-its-step",
        "shape-handed-to-the-loop-at-its-step",
        "a-fault-for-another-worker-is-not-this-ones",
        "a-fault-for-another-attempt-is-not-this-ones",
        "a-fault-for-this-attempt-is",
        "a-rollback-window-moves-the-data-not-the-steps",
    ],
)
def test_each_batch_gets_its_data_index_and_the_fault_due_before_it(
    faults: str,
    skip: tuple[SkipWindow, ...],
    attempt: int,
    fault_at: dict[int, FaultKind],
    indexes: list[int],
) -> None:
    cfg = config(
        "--steps", "4", faults=parse_faults(faults.split(",")), skip_windows=skip, attempt=attempt
    )
    run = start_run(cfg)
    train(run)
    assert run.indexes == indexes
    assert [f.kind if f else None for f in run.faults_seen] == [
        fault_at.get(step) for step in (1, 2, 3, 4)
    ]


@pytest.mark.parametrize(
    ("health", "faults", "slept"),
    [
        (True, "straggle@3", [0.2, 0.2]),
        (True, "slow-input@4", [0.2]),
        (True, "straggle@3:worker=1", []),
        (False, "straggle@3,slow-input@1", []),
        (False, "", []),
    ],
    ids=[
        "straggle-stays-on-from-its-step",
        "slow-input-delays-the-batch-from-its-step",
        "a-lasting-fault-for-another-worker",
        "loops-without-health-ignore-lasting-faults",
        "nothing-to-sleep",
    ],
)
def test_lasting_faults_apply_to_the_loops_that_measure_health(
    health: bool, faults: str, slept: list[float]
) -> None:
    run = start_run(config("--steps", "4", faults=parse_faults(faults.split(","))), health=health)
    train(run)
    assert run.time.slept == slept


@pytest.mark.parametrize(
    ("health", "every", "gathered_at"),
    [(True, 5, [5, 10]), (True, 3, [3, 6, 9]), (False, 5, [])],
    ids=["every-five-steps", "every-three-steps", "off-without-health"],
)
def test_health_is_gathered_on_its_interval_and_published_with_the_step(
    health: bool, every: int, gathered_at: list[int]
) -> None:
    run = start_run(config("--steps", "10", health_every=every), health=health)
    train(run, data_seconds=1.0, step_seconds=3.0)
    assert len(run.gather.rows) == len(gathered_at)
    # One second of four waiting for data: the worker's row says a quarter is input-bound.
    assert all(row[0] == pytest.approx(0.25) for row in run.gather.rows)
    assert all(row[1] == pytest.approx(3.0) for row in run.gather.rows)
    health_steps = [p.health.step if p.health else None for p in run.heartbeat.published]
    expected, last = [], None
    for step in range(1, 11):
        last = step if step in gathered_at else last
        expected.append(last)
    assert health_steps == expected


def test_every_step_is_published_with_its_numbers_and_finish_names_the_last_commit() -> None:
    saver = FakeSaver()
    run = start_run(config("--steps", "6", "--log-every", "3"), saver=saver)
    train(run, step_seconds=0.5)
    published = run.heartbeat.published
    assert [(p.step, p.total_steps, p.loss) for p in published] == [
        (s, 6, 1.0 / s) for s in range(1, 7)
    ]
    assert published[3].steps_per_second == pytest.approx(2.0)  # 3 steps in 1.5 s
    assert published[-1].checkpoint_step is None  # the last save still pending
    run.driver.finish()
    assert run.heartbeat.published[-1].step == 6
    assert run.heartbeat.published[-1].checkpoint_step == 6
    assert run.heartbeat.stopped


def test_the_step_time_of_a_demo_is_slept_after_every_step() -> None:
    run = start_run(config("--steps", "3", "--step-time", "0.5"))
    train(run)
    assert run.time.slept == [0.5, 0.5, 0.5]


def test_a_loss_spike_stops_only_a_loop_that_asked_for_it() -> None:
    from tpujob_trainer.loss_guard import LossGuard

    losses = {step: 1.0 for step in range(1, 10)} | {9: 50.0}
    quiet = start_run(config("--steps", "9"))
    train(quiet, losses=losses)
    assert quiet.stepped[-1] == 9
    loop = Loop(config("--steps", "9"))
    watched = StepDriver(
        loop, saver=None, heartbeat=None, guard=LossGuard(spike_factor=10, window=4)
    )
    with pytest.raises(NonFiniteLossError, match="spike"):
        for step in watched.steps(0):
            watched.after(step, losses[step], None, stop=lambda: False)
    assert loop.context.step == 9


@dataclass
class SlowSaver(FakeSaver):
    """Each save holds the loop up for the next of `holds` seconds (on the run's fake clock)."""

    holds: list[float] = field(default_factory=list)
    time: FakeTime | None = None

    def save(self, step: int, state: Any) -> bool:
        if self.time is not None and self.holds:
            self.time.now += self.holds.pop(0)
        return super().save(step, state)


def test_the_heartbeat_carries_the_mean_time_a_save_held_the_loop_up() -> None:
    saver = SlowSaver(holds=[3.0, 1.0])
    run = start_run(config("--steps", "8"), saver=saver)
    saver.time = run.time
    train(run)
    published = {p.step: p.save_seconds for p in run.heartbeat.published}
    assert [published[s] for s in (3, 4, 7, 8)] == [None, 3.0, 3.0, 2.0]


def test_a_save_the_fence_refused_is_not_counted_as_a_save() -> None:
    saver = SlowSaver(refuse=True)
    run = start_run(config("--steps", "4"), saver=saver)
    train(run)
    assert run.heartbeat.published[-1].save_seconds is None
