"""Loss checks, rollback windows, lasting faults and health annotations (pure parts)."""

from __future__ import annotations

import math

import pytest

from tpujob_trainer.contract import (
    HEARTBEAT_HEALTH_STEP,
    HEARTBEAT_INPUT_BOUND_FRACTION,
    HEARTBEAT_WORKER_RSS_BYTES,
    HEARTBEAT_WORKER_STEP_SECONDS,
    ExitCode,
)
from tpujob_trainer.faults import FaultKind, lasting, parse_fault, restore_error_from
from tpujob_trainer.health import StepTiming, StepWindow, from_rows, rss_bytes
from tpujob_trainer.heartbeat import health_annotations
from tpujob_trainer.loss_guard import Anomaly, LossGuard, NonFiniteLossError
from tpujob_trainer.rollback import SkipWindow, data_index, parse_skip_batches

pytestmark = pytest.mark.trainer


@pytest.mark.parametrize(
    ("losses", "spike_factor", "anomaly"),
    [
        ([1.0, math.nan], None, Anomaly.NAN),
        ([1.0, math.inf], None, Anomaly.INFINITE),
        ([1.0, -math.inf], None, Anomaly.INFINITE),
        ([1.0, 1.1, 0.9, 50.0], 10.0, Anomaly.SPIKE),
        ([1.0, 1.1, 0.9, 50.0], None, None),
        ([1.0, 50.0], 10.0, None),
    ],
    ids=[
        "nan",
        "inf",
        "minus-inf",
        "spike-over-running-median",
        "spike-check-off-by-default",
        "no-spike-before-the-window-fills",
    ],
)
def test_loss_guard_stops_at_the_bad_step(
    losses: list[float], spike_factor: float | None, anomaly: Anomaly | None
) -> None:
    guard = LossGuard(spike_factor=spike_factor, window=3)
    *good, last = losses
    for step, loss in enumerate(good, start=1):
        guard.check(step, loss)
    if anomaly is None:
        guard.check(len(losses), last)
        return
    with pytest.raises(NonFiniteLossError) as raised:
        guard.check(len(losses), last)
    assert raised.value.exit_code is ExitCode.NON_FINITE_LOSS
    assert (raised.value.step, raised.value.anomaly) == (len(losses), anomaly)
    assert "learning rate" in raised.value.summary


@pytest.mark.parametrize(
    ("text", "resume", "windows"),
    [
        (None, None, ()),
        ("5", 120, (SkipWindow(120, 5),)),
        ("300:4,120:5", None, (SkipWindow(120, 5), SkipWindow(300, 4))),
    ],
    ids=["unset", "count-after-resume-step", "window-list-sorted"],
)
def test_skip_batches_parse(
    text: str | None, resume: int | None, windows: tuple[SkipWindow, ...]
) -> None:
    assert parse_skip_batches(text, resume) == windows


@pytest.mark.parametrize(
    "text",
    ["5", "x:3", "3:-1", "3", "1:99999999"],
    ids=["count-without-resume", "bad-step", "negative", "bare-no-resume", "huge"],
)
def test_malformed_skip_batches_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_skip_batches(text, None)


def test_data_index_moves_past_every_skipped_window() -> None:
    windows = (SkipWindow(120, 5), SkipWindow(300, 4))
    assert [data_index(s, windows) for s in (120, 121, 300, 301)] == [120, 126, 305, 310]


def test_lasting_faults_stay_on_from_their_step_for_their_worker() -> None:
    faults = (parse_fault("straggle@5:worker=1"), parse_fault("restore-error@1:attempt=2"))
    on = [lasting(faults, FaultKind.STRAGGLE, step=s, worker=1, attempt=0) for s in (4, 5, 90)]
    assert on == [False, True, True]
    assert not lasting(faults, FaultKind.STRAGGLE, step=9, worker=0, attempt=0)
    assert restore_error_from(faults, worker=0, attempt=2) == 1
    assert restore_error_from(faults, worker=0, attempt=1) is None


def test_health_window_and_annotations() -> None:
    window = StepWindow(size=2)
    for wait in (9.0, 0.5, 0.1):
        window.record(StepTiming(data_wait=wait, host=0.2, wall=1.0))
    assert window.input_bound_fraction() == pytest.approx(0.3)
    health = from_rows(40, [window.row(256 << 20), [0.0, 0.9, 512.0]])
    annotations = health_annotations(health)
    assert annotations[HEARTBEAT_HEALTH_STEP] == "40"
    assert annotations[HEARTBEAT_INPUT_BOUND_FRACTION] == "0.1500"
    assert annotations[HEARTBEAT_WORKER_STEP_SECONDS] == "0.2000,0.9000"
    assert annotations[HEARTBEAT_WORKER_RSS_BYTES] == f"{256 << 20},{512 << 20}"
    assert rss_bytes() > 1 << 20
