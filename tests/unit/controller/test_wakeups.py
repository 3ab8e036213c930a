"""Whom an event wakes: the jobs it concerns, the oldest waiter of a freed shape, and a
heartbeat only when it matters."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

from tpujob.api import contract
from tpujob.controller.wakeups import WakeBook
from tpujob.observed.views import Heartbeat

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def beat(attempt: int | None, step: int = 10) -> Heartbeat:
    return Heartbeat(renewed=T0, step=step, attempt=attempt)


def test_a_freed_pool_wakes_the_longest_waiting_job_of_its_shape_only() -> None:
    book = WakeBook()
    events = {k: book.waker(("ns", k)) for k in ("v5p-old", "v5e-old", "v5e-new")}
    book.settled(("ns", "v5p-old"), finished=False, waiting_for=("tpu-v5p-slice", "2x2x2"))
    book.settled(("ns", "v5e-old"), finished=False, waiting_for=("tpu-v5-lite", "4x4"))
    book.settled(("ns", "v5e-new"), finished=False, waiting_for=("tpu-v5-lite", "4x4"))
    # Waiting again keeps a job's place in line.
    book.settled(("ns", "v5e-old"), finished=False, waiting_for=("tpu-v5-lite", "4x4"))
    assert book.pool_freed(("tpu-v5-lite", "4x4"), at=0.0) == [("ns", "v5e-old")]
    assert [k for k, e in events.items() if e.is_set()] == ["v5e-old"]


def test_a_placed_job_leaves_the_line() -> None:
    book = WakeBook()
    book.waker(("ns", "a"))
    book.settled(("ns", "a"), finished=False, waiting_for=("x", "1"))
    book.settled(("ns", "a"), finished=False, waiting_for=None)
    assert book.pool_freed(("x", "1"), at=0.0) == []


def test_node_events_skip_finished_jobs() -> None:
    book = WakeBook()
    live, done = book.waker(("ns", "live")), book.waker(("ns", "done"))
    book.settled(("ns", "done"), finished=True, waiting_for=None)
    assert book.wake_live([("ns", "live"), ("ns", "done"), ("ns", "unknown")], at=0.0) == 1
    assert live.is_set() and not done.is_set()


def test_a_heartbeat_wakes_at_once_for_a_new_attempt_and_otherwise_once_per_interval() -> None:
    book = WakeBook(progress_interval_seconds=15.0)
    key = ("ns", "job")
    assert book.heartbeat(key, beat(1), now=T0)
    assert not book.heartbeat(key, beat(1, step=11), now=T0 + dt.timedelta(seconds=5))
    assert book.heartbeat(key, beat(2, step=0), now=T0 + dt.timedelta(seconds=6))
    assert not book.heartbeat(key, beat(2, step=3), now=T0 + dt.timedelta(seconds=20))
    assert book.heartbeat(key, beat(2, step=9), now=T0 + dt.timedelta(seconds=21))


def test_a_finished_jobs_heartbeat_wakes_nothing() -> None:
    book = WakeBook()
    book.settled(("ns", "job"), finished=True, waiting_for=None)
    assert not book.heartbeat(("ns", "job"), beat(1), now=T0)


def test_wake_records_when_for_the_latency_metric_and_forget_clears_everything() -> None:
    book = WakeBook()
    key = ("ns", "job")
    book.waker(key)
    assert book.wake(key, at=5.0)
    assert book.wake(key, at=9.0)  # already set: the first wake's time is kept
    assert book.woken_at[key] == 5.0
    book.forget(key)
    assert key not in book.wakers and key not in book.woken_at
    assert not book.wake(key, at=1.0)


def test_a_new_failure_report_wakes_the_job_at_once() -> None:
    book = WakeBook(progress_interval_seconds=15)
    key = ("ns", "job")
    report = contract.FailureReport(1, "uid", 137, 9, "Error", "", "2026-01-01T00:00:00Z")
    assert book.heartbeat(key, beat(1), now=T0)
    reported = replace(beat(1, step=11), failures={(0, 1): report})
    assert book.heartbeat(key, reported, now=T0 + dt.timedelta(seconds=2))
    # The same report again is no news.
    assert not book.heartbeat(key, reported, now=T0 + dt.timedelta(seconds=3))
    again = replace(reported, failures={(0, 1): report, (0, 0): report})
    assert book.heartbeat(key, again, now=T0 + dt.timedelta(seconds=4))
