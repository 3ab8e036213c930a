"""The job's memory grades a recurring failure by where it recurs; the node ledger across jobs."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tpujob.diagnosis import (
    FailureClass,
    FailureCode,
    JobFacts,
    PastFailure,
    WorkerFacts,
    diagnose_job,
)
from tpujob.diagnosis.memory import (
    Blame,
    Escalation,
    LedgerFormatError,
    NodeLedger,
    failure_signature,
    judge,
    ledger_from_data,
    ledger_to_data,
    record_blame,
)

SIG = failure_signature(FailureCode.PROCESS_CRASHED, "segfault in worker 3 at 0x7f00")
OTHER = failure_signature(FailureCode.PROCESS_CRASHED, "something else")
S, M, H, F = FailureClass.SOFT, FailureClass.MEDIUM, FailureClass.HARD, FailureClass.FATAL


def crash(
    attempt: int,
    node: str,
    sl: int = 0,
    *,
    sig: str = SIG,
    cls: FailureClass = M,
    code: FailureCode = FailureCode.PROCESS_CRASHED,
    progressed: bool = False,
) -> PastFailure:
    return PastFailure(
        signature=sig,
        code=code,
        node=node,
        slice_index=sl,
        attempt=attempt,
        failure_class=cls,
        memory_signature=sig,
        progressed=progressed,
    )


CASES = [
    ("first-failure-keeps-its-class", [crash(1, "n1")], Escalation.NONE, M, None),
    ("same-node-twice-blames-it", [crash(1, "n1"), crash(2, "n1")], Escalation.SAME_NODE, H, "n1"),
    (
        "two-nodes-is-the-program",
        [crash(1, "n1"), crash(2, "n2", 1)],
        Escalation.ACROSS_NODES,
        F,
        None,
    ),
    (
        "progress-between-resets",
        [crash(1, "n1"), crash(2, "n2", progressed=True)],
        Escalation.NONE,
        M,
        None,
    ),
    (
        "the-first-attempt-training-before-it-failed-counts",
        [crash(1, "n1", progressed=True), crash(2, "n1")],
        Escalation.SAME_NODE,
        H,
        "n1",
    ),
    (
        "progress-before-the-last-repeat-cuts-what-came-before-it",
        [crash(1, "n1"), crash(2, "n2", 1, progressed=True), crash(3, "n2", 1)],
        Escalation.SAME_NODE,
        H,
        "n2",
    ),
    (
        "a-hard-failure-on-another-node-is-another-broken-node",
        [
            crash(1, "n1", cls=H, code=FailureCode.NODE_LOST),
            crash(2, "n2", cls=H, code=FailureCode.NODE_LOST),
        ],
        Escalation.NONE,
        H,
        None,
    ),
    (
        "a-kill-from-outside-twice-on-one-node-proves-nothing",
        [crash(i, "n1", cls=S, code=FailureCode.PROCESS_KILLED) for i in (1, 2)],
        Escalation.NONE,
        S,
        None,
    ),
    (
        "other-signature-resets",
        [crash(1, "n1", sig=OTHER), crash(2, "n2")],
        Escalation.NONE,
        M,
        None,
    ),
    (
        "preemption-recurring-proves-nothing",
        [crash(i, f"n{i}", cls=S, code=FailureCode.PREEMPTED) for i in (1, 2)],
        Escalation.NONE,
        S,
        None,
    ),
    (
        "soft-not-clearing-backs-off",
        [crash(i, f"n{i}", cls=S, code=FailureCode.PREEMPTED) for i in range(1, 6)],
        Escalation.SOFT_NOT_CLEARING,
        M,
        None,
    ),
    (
        "soft-never-clearing-stops",
        [crash(i, f"n{i}", cls=S, code=FailureCode.PREEMPTED) for i in range(1, 8)],
        Escalation.GIVE_UP,
        F,
        None,
    ),
]


@pytest.mark.parametrize(
    ("history", "escalation", "cls", "node"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_recurrence_is_graded_by_where_it_recurs(
    history: list[PastFailure], escalation: Escalation, cls: FailureClass, node: str | None
) -> None:
    verdict = judge(history)
    assert (verdict.escalation, verdict.failure_class, verdict.blamed_node) == (
        escalation,
        cls,
        node,
    )


def test_recurrence_across_nodes_says_how_often_and_where() -> None:
    history = [crash(1, "n1"), crash(2, "n2", 1), crash(3, "n3", 2)]
    assert judge(history).evidence.startswith("seen 3 times on 3 nodes")


def test_signature_ignores_numbers_ids_and_paths() -> None:
    a = failure_signature(FailureCode.UNKNOWN, "crash at 0x7f12 in /opt/a/b.py step 12")
    b = failure_signature(FailureCode.UNKNOWN, "crash at 0x9e00 in /usr/x/y.py step 99")
    assert a == b != failure_signature(FailureCode.HOST_OOM, "crash at 0x7f12")


def test_two_jobs_blaming_one_node_in_the_window_make_it_hard() -> None:
    ledger, first = record_blame(NodeLedger(), Blame("n1", "ns/a", 100.0), now=100.0)
    ledger, second = record_blame(ledger, Blame("n1", "ns/b", 200.0), now=200.0)
    assert first.escalation is Escalation.NONE
    assert (second.failure_class, second.blamed_node) == (FailureClass.HARD, "n1")


def test_blames_outside_the_window_are_forgotten() -> None:
    ledger, _ = record_blame(NodeLedger(), Blame("n1", "ns/a", 0.0), now=0.0, window_s=60)
    ledger, verdict = record_blame(ledger, Blame("n1", "ns/b", 120.0), now=120.0, window_s=60)
    assert verdict.escalation is Escalation.NONE
    assert [b.job for b in ledger.blames] == ["ns/b"]


def test_ledger_is_bounded_and_survives_a_configmap_round_trip() -> None:
    ledger = NodeLedger()
    for i in range(50):
        ledger, _ = record_blame(
            ledger, Blame(f"n{i}", "ns/a", float(i)), now=float(i), max_entries=10
        )
    assert len(ledger.blames) == 10
    data = ledger_to_data(ledger)
    assert all(isinstance(v, str) for v in data.values())
    assert ledger_from_data(data) == ledger


def test_malformed_stored_ledger_is_a_typed_error() -> None:
    with pytest.raises(LedgerFormatError):
        ledger_from_data({"ledger.json": '[["n1", "job"]]'})


def test_the_signature_ignores_which_worker_failed_and_whether_others_failed_after() -> None:
    # Whether the peer's failure was seen before the operator diagnosed is timing, not cause.
    t = datetime(2026, 1, 1, tzinfo=UTC)
    killed = WorkerFacts(worker_index=1, exit_code=137, node_name="n1", finished_at=t)
    peer = WorkerFacts(
        worker_index=0, exit_code=30, node_name="n2", finished_at=t + timedelta(seconds=1)
    )
    alone = diagnose_job(JobFacts(workers=(replace(killed, worker_index=0),)))
    with_peer = diagnose_job(JobFacts(workers=(killed, peer)))
    assert with_peer.code is FailureCode.PROCESS_KILLED
    assert "other worker failed after" in with_peer.summary
    assert failure_signature(alone.code, alone.summary) == failure_signature(
        with_peer.code, with_peer.summary
    )
    assert failure_signature(alone.code, alone.summary) != failure_signature(
        alone.code, f"{alone.summary} on a different path"
    )
