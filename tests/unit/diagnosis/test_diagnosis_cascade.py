"""A job's root worker is found among its failed workers; the rest form the chain."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tpujob.diagnosis import (
    FailureClass,
    FailureCode,
    HeartbeatFacts,
    JobFacts,
    NodeFacts,
    WorkerFacts,
    diagnose_job,
)
from tpujob.diagnosis.cascade import MAX_DIAGNOSED_WORKERS

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GLOO = (
    "jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: [gloo/transport/tcp/pair.cc]"
    " Connection closed by peer [10.0.0.2]:4000"
)
HEARTBEAT = (
    "UNAVAILABLE: Task 1 heartbeat timeout. This indicates that the remote task has failed,"
    " got preempted, or crashed unexpectedly."
)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_killed_worker_is_root_and_soft_when_its_node_is_fine() -> None:
    survivor = WorkerFacts(worker_index=0, exit_code=1, log_tail=GLOO, finished_at=at(1))
    killed = WorkerFacts(worker_index=1, exit_code=137, finished_at=at(5))
    diagnosis = diagnose_job(JobFacts(workers=(survivor, killed)))
    assert diagnosis.root_worker == 1
    assert (diagnosis.failure_class, diagnosis.code) == (
        FailureClass.SOFT,
        FailureCode.PROCESS_KILLED,
    )
    assert [link.worker for link in diagnosis.chain] == [1, 0]


def test_node_lost_root_gives_hard_chain_from_node_to_symptom() -> None:
    survivor = WorkerFacts(worker_index=0, exit_code=1, log_tail=HEARTBEAT, finished_at=at(2))
    lost = WorkerFacts(
        worker_index=1,
        exit_code=137,
        node=NodeFacts(name="tpu-b", ready="Unknown"),
        finished_at=at(9),
    )
    diagnosis = diagnose_job(JobFacts(workers=(survivor, lost)))
    assert (diagnosis.failure_class, diagnosis.code) == (FailureClass.HARD, FailureCode.NODE_LOST)
    assert diagnosis.root_worker == 1
    chain = [str(link) for link in diagnosis.chain]
    assert "tpu-b" in chain[0]
    assert chain[1].startswith("worker 1: died")
    assert chain[2].startswith("worker 0: then")


def test_earliest_non_consequence_failure_is_root() -> None:
    late = WorkerFacts(worker_index=0, exit_code=1, log_tail="KeyError: 'x'", finished_at=at(8))
    early = WorkerFacts(
        worker_index=2, exit_code=1, log_tail="NaN loss during training", finished_at=at(3)
    )
    diagnosis = diagnose_job(JobFacts(workers=(late, early)))
    assert diagnosis.root_worker == 2
    assert diagnosis.code is FailureCode.NAN_LOSS


def test_only_consequences_falls_back_to_the_earliest() -> None:
    first = WorkerFacts(worker_index=3, exit_code=1, log_tail=GLOO, finished_at=at(1))
    second = WorkerFacts(
        worker_index=0, exit_code=1, log_tail="Shutdown barrier has failed", finished_at=at(2)
    )
    diagnosis = diagnose_job(JobFacts(workers=(second, first)))
    assert diagnosis.root_worker == 3
    assert diagnosis.failure_class is FailureClass.SOFT


def test_summary_counts_the_other_failed_workers() -> None:
    workers = tuple(
        WorkerFacts(worker_index=i, exit_code=1, log_tail=GLOO, finished_at=at(i + 1))
        for i in range(3)
    )
    assert "2 other workers failed after" in diagnose_job(JobFacts(workers=workers)).summary


def test_job_without_failed_workers_but_stalled_heartbeat_is_a_hang() -> None:
    job = JobFacts(heartbeat=HeartbeatFacts(seconds_since=1200, stall_timeout=600, step=40))
    diagnosis = diagnose_job(job)
    assert diagnosis.code is FailureCode.HANG
    assert diagnosis.step == 40


def test_a_killed_worker_is_the_root_of_a_peers_reported_collective_failure() -> None:
    from datetime import UTC, datetime

    from tpujob.api import contract
    from tpujob.diagnosis import JobFacts, WorkerFacts, diagnose_job

    same_second = datetime(2026, 1, 1, tzinfo=UTC)
    echo = contract.encode_termination_message(
        contract.TerminationMessage(
            code="COLLECTIVE_FAILURE",
            exit_code=30,
            class_hint=contract.ClassHint.SOFT,
            summary="Gloo all-reduce failed: Connection reset by peer",
            step=31,
        )
    )
    peer = WorkerFacts(
        worker_index=0, pod_name="w0", exit_code=30, message=echo, finished_at=same_second
    )
    killed = WorkerFacts(worker_index=1, pod_name="w1", exit_code=137, finished_at=same_second)
    verdict = diagnose_job(JobFacts(workers=(peer, killed)))
    assert verdict.root_worker == 1
    assert str(verdict.code) == "PROCESS_KILLED"


def test_every_worker_of_a_large_slice_failing_reads_the_earliest_and_counts_the_rest() -> None:
    """1,536 workers failed: the diagnosis reads `MAX_DIAGNOSED_WORKERS` of them, those that
    never exited (lost with their node) and the earliest to exit, and still finds the root."""
    peers = [
        WorkerFacts(worker_index=i, exit_code=1, log_tail=GLOO, finished_at=at(10 + i))
        for i in range(1, 1536)
    ]
    lost = WorkerFacts(
        worker_index=1536, exit_code=None, node=NodeFacts(name="tpu-z", ready="Unknown")
    )
    diagnosis = diagnose_job(JobFacts(workers=(*peers, lost)))
    assert (diagnosis.failure_class, diagnosis.code) == (FailureClass.HARD, FailureCode.NODE_LOST)
    assert diagnosis.root_worker == 1536
    assert "(1535 other workers failed after)" in diagnosis.summary
    assert len(diagnosis.chain) <= MAX_DIAGNOSED_WORKERS + 2
    read = {link.worker for link in diagnosis.chain} - {None}
    assert read <= {*range(1, MAX_DIAGNOSED_WORKERS), 1536}
