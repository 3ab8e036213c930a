"""Fencing: commit only while the Lease names this attempt, fail closed, agree across workers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tpujob_trainer.contract import LEASE_FENCE_ANNOTATION, LEASE_FENCE_JOB_ANNOTATION, ExitCode
from tpujob_trainer.fencing import Decision, FencedError, Reason, SaveGate, Verdict, agree, decide

pytestmark = pytest.mark.trainer


class FakeLease:
    """A LeaseReader over a dict of annotations, or one that fails like the API does."""

    def __init__(
        self, annotations: Mapping[str, str] | None = None, error: Exception | None = None
    ) -> None:
        self.annotations = dict(annotations or {})
        self.error = error
        self.reads: list[tuple[str, str]] = []

    def read_lease_annotations(self, name: str, namespace: str) -> Mapping[str, str]:
        self.reads.append((name, namespace))
        if self.error is not None:
            raise self.error
        return self.annotations


def fence(token: str) -> dict[str, str]:
    return {LEASE_FENCE_ANNOTATION: token, "tpujob.dev/step": "40"}


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (fence("3"), Decision(Verdict.COMMIT, Reason.CURRENT, 3)),
        (fence("4"), Decision(Verdict.FENCED, Reason.NEWER_ATTEMPT, 4)),
        (fence("2"), Decision(Verdict.SKIP, Reason.OLDER_TOKEN, 2)),
        ({}, Decision(Verdict.SKIP, Reason.MISSING)),
        (fence("three"), Decision(Verdict.SKIP, Reason.MALFORMED)),
        (fence("-4"), Decision(Verdict.SKIP, Reason.MALFORMED)),
        (fence("9" * 40), Decision(Verdict.SKIP, Reason.MALFORMED)),
        (fence("\u0664"), Decision(Verdict.SKIP, Reason.MALFORMED)),
        (None, Decision(Verdict.SKIP, Reason.UNREADABLE)),
    ],
    ids=[
        "own-attempt-commits",
        "newer-attempt-fences",
        "older-token-fails-closed",
        "missing-fails-closed",
        "garbage-fails-closed",
        "negative-fails-closed",
        "huge-fails-closed",
        "non-ascii-digit-fails-closed",
        "unreadable-fails-closed",
    ],
)
def test_decision_follows_the_token(
    annotations: Mapping[str, str] | None, expected: Decision
) -> None:
    assert decide(annotations, attempt=3) == expected


@pytest.mark.parametrize(
    ("annotations", "job_uid", "expected"),
    [
        (
            {**fence("3"), LEASE_FENCE_JOB_ANNOTATION: "uid-a"},
            "uid-a",
            Decision(Verdict.COMMIT, Reason.CURRENT, 3),
        ),
        (
            {**fence("3"), LEASE_FENCE_JOB_ANNOTATION: "uid-b"},
            "uid-a",
            Decision(Verdict.FENCED, Reason.OTHER_JOB),
        ),
        (
            {**fence("1"), LEASE_FENCE_JOB_ANNOTATION: "uid-b"},
            "uid-a",
            Decision(Verdict.FENCED, Reason.OTHER_JOB),
        ),
        (fence("3"), "uid-a", Decision(Verdict.COMMIT, Reason.CURRENT, 3)),
        (
            {**fence("3"), LEASE_FENCE_JOB_ANNOTATION: "uid-b"},
            None,
            Decision(Verdict.COMMIT, Reason.CURRENT, 3),
        ),
    ],
    ids=[
        "own-job-own-attempt-commits",
        "another-job-same-attempt-fences",
        "another-job-any-token-fences",
        "lease-without-uid-counts-attempts",
        "trainer-without-uid-counts-attempts",
    ],
)
def test_a_lease_that_counts_another_jobs_attempts_fences(
    annotations: Mapping[str, str], job_uid: str | None, expected: Decision
) -> None:
    assert decide(annotations, attempt=3, job_uid=job_uid) == expected


def test_a_leftover_of_an_earlier_job_of_the_same_name_is_told_why_it_stopped() -> None:
    lease = FakeLease({**fence("1"), LEASE_FENCE_JOB_ANNOTATION: "uid-new"})
    gate = SaveGate(lease, lease="train-heartbeat", namespace="team", attempt=1, job_uid="uid-old")
    with pytest.raises(FencedError) as raised:
        gate.authorize(10)
    assert raised.value.exit_code is ExitCode.FENCED
    assert "another job of the same name owns the checkpoints" in raised.value.summary


def test_the_most_restrictive_worker_decides_for_the_job() -> None:
    commit, skip, fenced = (
        (int(Verdict.COMMIT), 0, 3),
        (int(Verdict.SKIP), 2, -1),
        (int(Verdict.FENCED), 1, 4),
    )
    assert agree([commit, commit]).verdict is Verdict.COMMIT
    assert agree([commit, skip, commit]).verdict is Verdict.SKIP
    assert agree([skip, fenced, commit]) == Decision(Verdict.FENCED, Reason.NEWER_ATTEMPT, 4)


def gate(lease: FakeLease, gather: object = None, attempt: int = 3) -> SaveGate:
    if gather is None:
        return SaveGate(lease, lease="job-heartbeat", namespace="ml", attempt=attempt)
    return SaveGate(lease, lease="job-heartbeat", namespace="ml", attempt=attempt, gather=gather)  # type: ignore[arg-type]


def test_gate_commits_for_the_current_attempt_and_reads_the_named_lease() -> None:
    lease = FakeLease(fence("3"))
    assert gate(lease).authorize(10)
    assert lease.reads == [("job-heartbeat", "ml")]


@pytest.mark.parametrize(
    "lease",
    [
        FakeLease(error=TimeoutError("read timed out")),
        FakeLease(error=ConnectionError("refused")),
        FakeLease({}),
    ],
    ids=["timeout", "api-down", "no-token"],
)
def test_gate_skips_the_save_and_keeps_training_when_it_cannot_know(lease: FakeLease) -> None:
    checked = gate(lease)
    assert not checked.authorize(10)
    assert checked.skipped == 1
    lease.error, lease.annotations = None, fence("3")
    assert checked.authorize(20)


def test_gate_raises_fenced_with_the_contract_code_when_a_newer_attempt_owns_the_lease() -> None:
    with pytest.raises(FencedError) as raised:
        gate(FakeLease(fence("5"))).authorize(10)
    assert raised.value.exit_code is ExitCode.FENCED
    assert "attempt 3 is fenced: attempt 5 owns the checkpoints" in raised.value.summary


def peer(verdict: Verdict, reason: Reason, token: int) -> object:
    """An all-gather with one other worker whose own decision was (verdict, reason, token)."""
    other = (int(verdict), list(Reason).index(reason), token)
    return lambda row: [row, other]


@pytest.mark.parametrize(
    ("other", "saves"),
    [
        (peer(Verdict.COMMIT, Reason.CURRENT, 3), True),
        (peer(Verdict.SKIP, Reason.UNREADABLE, -1), False),
        (peer(Verdict.SKIP, Reason.MISSING, -1), False),
    ],
    ids=[
        "both-current-save",
        "peer-cannot-read-so-nobody-saves",
        "peer-sees-no-token-so-nobody-saves",
    ],
)
def test_the_agreed_verdict_binds_a_worker_whose_own_read_succeeded(
    other: object, saves: bool
) -> None:
    # Never one worker entering the collective save alone: that would deadlock the others.
    assert gate(FakeLease(fence("3")), other).authorize(10) is saves


def test_a_peer_that_sees_a_newer_attempt_fences_the_whole_job() -> None:
    with pytest.raises(FencedError) as raised:
        gate(FakeLease(fence("3")), peer(Verdict.FENCED, Reason.NEWER_ATTEMPT, 4)).authorize(10)
    assert raised.value.decision.token == 4


def test_a_fenced_checkpoint_save_writes_nothing(tmp_path: Path) -> None:
    import jax.numpy as jnp

    from tpujob_trainer.checkpointing import Checkpoints

    directory = tmp_path / "ckpt"
    checkpoints = Checkpoints(str(directory), keep=3, attempt=3, gate=gate(FakeLease(fence("3"))))
    assert checkpoints.save(5, {"w": jnp.ones(3)})
    checkpoints.wait()
    zombie = Checkpoints(
        str(directory), keep=1, attempt=2, gate=gate(FakeLease(fence("3")), attempt=2)
    )
    with pytest.raises(FencedError):
        zombie.save(9, {"w": jnp.zeros(3)})
    skipping = Checkpoints(str(directory), keep=1, attempt=3, gate=gate(FakeLease({})))
    assert not skipping.save(9, {"w": jnp.zeros(3)})
    checkpoints.close(), zombie.close(), skipping.close()
    assert sorted(p.name for p in directory.iterdir()) == ["5"]
