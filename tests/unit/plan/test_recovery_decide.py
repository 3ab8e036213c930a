"""The recovery policy as a table: which failure, on which job, gets which decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.unit.builders import job_body, running_status

from tpujob import diagnosis as dx
from tpujob.api import parse_job
from tpujob.api.reasons import FailReason
from tpujob.plan.recovery import Broken, FailJob, Restart, decide

NO_BREAK = Broken(lost_nodes=(), moving_nodes=(), slices=frozenset(), root_node=None, root_slice=0)
LOST_W1 = Broken(
    lost_nodes=("pool-0-w1",),
    moving_nodes=(),
    slices=frozenset({0}),
    root_node="pool-0-w1",
    root_slice=0,
)
TWO_LOST = Broken(
    lost_nodes=("pool-0-w0", "pool-0-w1"),
    moving_nodes=(),
    slices=frozenset({0}),
    root_node="pool-0-w0",
    root_slice=0,
)
JOB_HISTORY_ONLY = Broken(
    lost_nodes=(),
    moving_nodes=(),
    slices=frozenset({0}),
    root_node="pool-0-w0",
    root_slice=0,
    job_nodes=("pool-0-w0",),
)


def diagnosis(cls: dx.FailureClass, code: dx.FailureCode) -> dx.Diagnosis:
    return dx.Diagnosis(
        failure_class=cls,
        code=code,
        summary=f"worker 0: {code}",
        confidence=dx.Confidence.HIGH,
        rule="test",
        advice="do this",
    )


@dataclass(frozen=True)
class Case:
    name: str
    d: dx.Diagnosis
    broken: Broken = NO_BREAK
    recovery: dict[str, Any] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    # The decision: a FailReason, or the restart's fields that matter here.
    fails: FailReason | None = None
    restart: dict[str, Any] = field(default_factory=dict)


SOFT, MEDIUM, HARD, FATAL = (
    dx.FailureClass.SOFT,
    dx.FailureClass.MEDIUM,
    dx.FailureClass.HARD,
    dx.FailureClass.FATAL,
)
C = dx.FailureCode

CASES = [
    Case("a user's bug fails the job", diagnosis(FATAL, C.USER_CODE_ERROR), fails=FailReason.FATAL),
    Case(
        "a non-finite loss past its rollbacks fails the job",
        diagnosis(MEDIUM, C.NAN_LOSS),
        recovery={"maxNanRollbacks": 2},
        status={"nanRollbacks": 2},
        fails=FailReason.NON_FINITE_LOSS,
    ),
    Case(
        "no automatic recovery fails even a soft failure",
        diagnosis(SOFT, C.PROCESS_KILLED),
        recovery={"autoRecovery": False},
        fails=FailReason.AUTO_RECOVERY_OFF,
    ),
    Case(
        "a class whose budget is spent fails the job",
        diagnosis(SOFT, C.PROCESS_KILLED),
        recovery={"maxSoftRestarts": 2},
        restarts={"soft": 2},
        fails=FailReason.RESTART_BUDGET,
    ),
    Case(
        "more failed nodes than maxFailedNodes fails the job",
        diagnosis(HARD, C.NODE_LOST),
        broken=TWO_LOST,
        fails=FailReason.FAILED_NODE_BUDGET,
    ),
    Case(
        "a soft failure restarts at once in place",
        diagnosis(SOFT, C.PROCESS_KILLED),
        restart={"delay_seconds": 0, "move_slices": frozenset(), "blame_nodes": ()},
    ),
    Case(
        "a third medium failure waits the doubled backoff with a doubled collective timeout",
        diagnosis(MEDIUM, C.COLLECTIVE_TIMEOUT),
        recovery={"backoff": {"initialSeconds": 10, "maxSeconds": 600}},
        restarts={"medium": 2},
        restart={"delay_seconds": 40, "collective_timeout_seconds": 300 * 8},
    ),
    Case(
        "a lost node is blamed, marked for every job, and its slice moves",
        diagnosis(HARD, C.NODE_LOST),
        broken=LOST_W1,
        restart={
            "move_slices": frozenset({0}),
            "blame_nodes": ("pool-0-w1",),
            "mark_nodes": ("pool-0-w1",),
        },
    ),
    Case(
        "a node only this job's history blames is avoided by this job, not marked for others",
        diagnosis(HARD, C.DEVICE_BUSY),
        broken=JOB_HISTORY_ONLY,
        restart={"blame_nodes": ("pool-0-w0",), "mark_nodes": ()},
    ),
    Case(
        "a hard grade without node evidence moves the slice and blames no node",
        diagnosis(HARD, C.ACCELERATOR_HARDWARE_ERROR),
        restart={"move_slices": frozenset({0}), "blame_nodes": (), "mark_nodes": ()},
    ),
    Case(
        "a preempted worker stops gracefully and blames nothing",
        diagnosis(SOFT, C.PREEMPTED),
        restart={"graceful": True, "blame_nodes": ()},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_recovery_decides(case: Case) -> None:
    status = {**running_status(attempt=1), **case.status}
    status["restarts"] = case.restarts
    job = parse_job(job_body(status=status, recovery=case.recovery))
    decision = decide(case.d, job, case.broken, base_collective_timeout=300)
    if case.fails is not None:
        assert isinstance(decision, FailJob)
        assert decision.reason is case.fails
        assert decision.message.startswith(case.d.headline)
    else:
        assert isinstance(decision, Restart)
        assert decision.failure_class == case.d.failure_class
        got = {k: getattr(decision, k) for k in case.restart}
        assert got == case.restart
