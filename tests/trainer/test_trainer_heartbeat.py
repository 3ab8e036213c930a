"""The heartbeat renews the Lease on progress only, at a bounded rate, and survives API errors."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tpujob_trainer.config import load_config
from tpujob_trainer.contract import (
    ENV_ATTEMPT,
    ENV_HEARTBEAT_LEASE,
    ENV_JOB_UID,
    ENV_NAMESPACE,
    HEARTBEAT_ATTEMPT,
    HEARTBEAT_CHECKPOINT_STEP,
    HEARTBEAT_JOB_UID,
    HEARTBEAT_LOCAL_CHECKPOINT_STEP,
    HEARTBEAT_LOSS,
    HEARTBEAT_REJOINS,
    HEARTBEAT_SAVE_SECONDS,
    HEARTBEAT_STEP,
    HEARTBEAT_STEPS_PER_SECOND,
    HEARTBEAT_TOTAL_STEPS,
)
from tpujob_trainer.heartbeat import Heartbeat, Progress
from tpujob_trainer.runtime import Loop, announce
from tpujob_trainer.step_driver import StepDriver

pytestmark = pytest.mark.trainer

NOW = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


class RecordingLeases:
    """A LeaseClient that keeps every patch, or fails the first `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        self.failures = failures

    def patch_lease(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("apiserver unreachable")
        self.patches.append((name, namespace, body))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def progress(step: int) -> Progress:
    return Progress(
        step=step, total_steps=50, loss=0.25, steps_per_second=2.5, checkpoint_step=10, attempt=1
    )


def make(client: RecordingLeases, clock: FakeClock) -> Heartbeat:
    return Heartbeat(
        client,
        name="job-heartbeat",
        namespace="ml",
        min_interval=1.0,
        clock=clock,
        wall_clock=lambda: NOW,
    )


def test_renewal_publishes_progress_as_renew_time_and_annotations() -> None:
    client, clock = RecordingLeases(), FakeClock()
    heartbeat = make(client, clock)
    heartbeat.progress(progress(12))
    assert heartbeat.renew_if_due()
    name, namespace, body = client.patches[0]
    assert (name, namespace) == ("job-heartbeat", "ml")
    assert body["spec"]["renewTime"] == "2030-01-02T03:04:05.678901Z"
    assert body["metadata"]["annotations"] == {
        HEARTBEAT_STEP: "12",
        HEARTBEAT_TOTAL_STEPS: "50",
        HEARTBEAT_LOSS: "0.25",
        HEARTBEAT_STEPS_PER_SECOND: "2.5",
        HEARTBEAT_CHECKPOINT_STEP: "10",
        HEARTBEAT_ATTEMPT: "1",
        HEARTBEAT_REJOINS: "false",
        HEARTBEAT_LOCAL_CHECKPOINT_STEP: "",
    }


def test_a_trainer_with_a_local_tier_publishes_its_step_beside_the_persistent_one() -> None:
    client, clock = RecordingLeases(), FakeClock()
    heartbeat = make(client, clock)
    heartbeat.progress(replace(progress(12), local_checkpoint_step=12))
    assert heartbeat.renew_if_due()
    annotations = client.patches[0][2]["metadata"]["annotations"]
    assert (
        annotations[HEARTBEAT_CHECKPOINT_STEP],
        annotations[HEARTBEAT_LOCAL_CHECKPOINT_STEP],
    ) == ("10", "12")


def test_a_trainer_that_knows_its_job_signs_its_beats_with_the_job_uid() -> None:
    client = RecordingLeases()
    heartbeat = Heartbeat(
        client, name="job-heartbeat", namespace="ml", job_uid="uid-2", wall_clock=lambda: NOW
    )
    heartbeat.progress(progress(12))
    assert heartbeat.renew_if_due()
    assert client.patches[0][2]["metadata"]["annotations"][HEARTBEAT_JOB_UID] == "uid-2"


def test_a_supervised_trainer_says_so_on_its_heartbeat() -> None:
    client, clock = RecordingLeases(), FakeClock()
    heartbeat = make(client, clock)
    heartbeat.progress(replace(progress(12), rejoins=True))
    assert heartbeat.renew_if_due()
    assert client.patches[0][2]["metadata"]["annotations"][HEARTBEAT_REJOINS] == "true"


def test_a_trainer_that_saved_says_what_a_save_cost_it() -> None:
    client, clock = RecordingLeases(), FakeClock()
    heartbeat = make(client, clock)
    heartbeat.progress(replace(progress(12), save_seconds=0.123456))
    assert heartbeat.renew_if_due()
    assert client.patches[0][2]["metadata"]["annotations"][HEARTBEAT_SAVE_SECONDS] == "0.123"


@pytest.mark.parametrize(
    ("events", "renewals"),
    [
        ([("renew", 0.0)], 0),
        ([("step", 0.0), ("renew", 0.0), ("renew", 5.0)], 1),
        ([("step", 0.0), ("renew", 0.0), ("step", 0.2), ("renew", 0.5), ("renew", 1.0)], 2),
        (
            [
                ("step", 0.0),
                ("renew", 0.0),
                ("step", 0.1),
                ("renew", 0.4),
                ("step", 0.6),
                ("renew", 0.9),
            ],
            1,
        ),
    ],
    ids=[
        "no-step-no-renewal",
        "a-hung-step-stops-renewing",
        "next-step-waits-for-interval",
        "many-steps-in-one-interval-renew-once",
    ],
)
def test_renewals_follow_progress_and_the_rate_limit(
    events: list[tuple[str, float]], renewals: int
) -> None:
    client, clock = RecordingLeases(), FakeClock()
    heartbeat = make(client, clock)
    step = 0
    for event, at in events:
        clock.now = 100.0 + at
        if event == "step":
            step += 1
            heartbeat.progress(progress(step))
        else:
            heartbeat.renew_if_due()
    assert len(client.patches) == renewals


def test_api_errors_are_counted_and_the_next_step_renews_again() -> None:
    client, clock = RecordingLeases(failures=1), FakeClock()
    heartbeat = make(client, clock)
    heartbeat.progress(progress(1))
    assert not heartbeat.renew_if_due()
    clock.now += 1.0
    heartbeat.progress(progress(2))
    assert heartbeat.renew_if_due()
    assert heartbeat.errors == 1
    assert client.patches[0][2]["metadata"]["annotations"][HEARTBEAT_STEP] == "2"


def test_background_thread_renews_while_steps_complete_and_survives_errors() -> None:
    client = RecordingLeases(failures=2)
    heartbeat = Heartbeat(client, name="hb", namespace="ml", min_interval=0.05)
    heartbeat.start()
    try:
        deadline = time.monotonic() + 5
        step = 0
        while len(client.patches) < 3 and time.monotonic() < deadline:
            step += 1
            heartbeat.progress(progress(step))
            time.sleep(0.02)
    finally:
        heartbeat.stop()
    assert heartbeat.errors == 2
    assert len(client.patches) >= 3


def test_stop_publishes_the_last_step_even_within_the_interval() -> None:
    client, clock = RecordingLeases(), FakeClock()
    heartbeat = make(client, clock)
    heartbeat.progress(progress(49))
    heartbeat.renew_if_due()
    clock.now += 0.1
    heartbeat.progress(progress(50))
    heartbeat.stop()
    assert [p[2]["metadata"]["annotations"][HEARTBEAT_STEP] for p in client.patches] == ["49", "50"]


class PendingSaves:
    """A saver whose saves commit only when closed (orbax's async saves, at their slowest)."""

    def __init__(self, committed: int) -> None:
        self.committed, self.started = committed, committed

    def save(self, step: int, state: Any) -> bool:
        self.started = step
        return True

    def committed_step(self) -> int | None:
        return self.committed

    def wait(self) -> int | None:
        self.committed = self.started
        return self.committed

    def close(self) -> int | None:
        return self.wait()


def test_the_last_renewal_names_the_checkpoint_committed_after_the_last_step() -> None:
    """The final save commits after the last step was published (saves are asynchronous);
    stopping a loop's heartbeat publishes that step again with it."""
    client, clock = RecordingLeases(), FakeClock()
    heartbeat = make(client, clock)
    loop = Loop(load_config(["--steps", "50"], {}))
    driver = StepDriver(loop, saver=PendingSaves(committed=40), heartbeat=heartbeat)
    driver.after(50, 0.25, "state", stop=lambda: False)
    heartbeat.renew_if_due()
    clock.now += 0.1
    driver.finish()
    notes = [p[2]["metadata"]["annotations"] for p in client.patches]
    assert [(n[HEARTBEAT_STEP], n[HEARTBEAT_CHECKPOINT_STEP]) for n in notes] == [
        ("50", "40"),
        ("50", "50"),
    ]


def env_of(process: str) -> dict[str, str]:
    return {
        ENV_HEARTBEAT_LEASE: "job-heartbeat",
        ENV_NAMESPACE: "team-a",
        ENV_ATTEMPT: "3",
        ENV_JOB_UID: "uid-3",
        "JAX_COORDINATOR_ADDRESS": "job-0.job:8476",
        "JAX_PROCESS_ID": process,
        "JAX_NUM_PROCESSES": "2",
    }


def test_worker_zero_announces_its_attempt_and_clears_the_step_an_earlier_one_left() -> None:
    client = RecordingLeases()
    assert announce(load_config(["--steps", "50"], env_of("0")), client)
    [(name, namespace, body)] = client.patches
    assert (name, namespace) == ("job-heartbeat", "team-a")
    notes = body["metadata"]["annotations"]
    assert notes[HEARTBEAT_ATTEMPT] == "3"
    assert notes[HEARTBEAT_JOB_UID] == "uid-3"
    # A merge patch's null deletes the key: the operator must not read attempt 2's step as 3's.
    assert HEARTBEAT_STEP in notes and notes[HEARTBEAT_STEP] is None
    assert body["spec"]["renewTime"].endswith("Z")


@pytest.mark.parametrize(
    ("env", "client"),
    [
        (env_of("1"), RecordingLeases()),  # only worker 0 writes the Lease
        ({}, RecordingLeases()),  # outside the operator: no Lease
        (env_of("0"), RecordingLeases(failures=1)),  # the apiserver refuses: training goes on
    ],
    ids=["other-worker", "no-lease", "api-error"],
)
def test_an_announcement_that_cannot_be_made_is_skipped_without_raising(
    env: dict[str, str], client: RecordingLeases
) -> None:
    assert not announce(load_config(["--steps", "50"], env), client)
    assert client.patches == []
