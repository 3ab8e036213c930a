"""A trainer container killed whole restarts in its pod: its supervisor's report of the kill is
graded as a killed training process's (soft, PROCESS_KILLED, the pod kept), and a supervisor that
ended again at once after it had passed a SIGKILL on (`ExitCode.ENDED_AFTER_KILL`) shows the
operator the end before it (lastState), not its own."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, reported, running_status

from tpujob import diagnosis as dx
from tpujob.api import contract
from tpujob.observed.trouble import find_trouble
from tpujob.observed.views import pod_view
from tpujob_trainer.rejoin import KILLED_MESSAGE

AFTER_KILL = int(contract.ExitCode.ENDED_AFTER_KILL)
KILL = {"exitCode": 137, "reason": "OOMKilled", "message": "last words", "finishedAt": "T"}


def ended(code: int, last: dict[str, Any] | None) -> dict[str, Any]:
    job = job_body(status=running_status())
    raw = pod(job, 1, 0, 1, phase="Failed", exit_code=code, message="own")
    if last is not None:
        raw["status"]["containerStatuses"][0]["lastState"] = last
    return raw


@pytest.mark.parametrize(
    ("code", "last", "seen"),
    [
        (AFTER_KILL, {"terminated": KILL}, (137, "OOMKilled", "last words")),
        (AFTER_KILL, {}, (AFTER_KILL, "Error", "own")),
        (AFTER_KILL, None, (AFTER_KILL, "Error", "own")),
        (AFTER_KILL, {"terminated": "junk"}, (AFTER_KILL, "Error", "own")),
        (137, {"terminated": {**KILL, "exitCode": 1}}, (137, "Error", "own")),
        (1, {"terminated": KILL}, (1, "Error", "own")),
    ],
    ids=["after-kill", "no-last-state", "no-last-state-key", "junk", "own-137", "own-1"],
)
def test_the_end_before_a_supervisor_that_ended_after_a_kill_is_the_failure(
    code: int, last: dict[str, Any] | None, seen: tuple[int, str, str]
) -> None:
    view = pod_view(ended(code, last))
    assert (view.exit_code, view.reason, view.message) == seen


@pytest.mark.parametrize(
    ("last", "code"),
    [
        (None, dx.FailureCode.PROCESS_KILLED),
        ({"exitCode": 137, "reason": "Error"}, dx.FailureCode.PROCESS_KILLED),
        ({"exitCode": 137, "reason": "OOMKilled"}, dx.FailureCode.HOST_OOM),
    ],
    ids=["no-record", "killed", "oom-killed"],
)
def test_a_reported_container_kill_is_graded_from_the_kubelets_record_of_it(
    last: dict[str, Any] | None, code: dx.FailureCode
) -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    if last is not None:
        pods[1]["status"]["containerStatuses"][0]["lastState"] = {"terminated": last}
    beat = reported(
        lease(renewed=9, step=30),
        0,
        1,
        exit_code=137,
        message=KILLED_MESSAGE,
        reason=contract.CONTAINER_KILLED_REASON,
    )
    seen = observed(job, pods, heartbeat=beat)
    trouble = find_trouble(
        seen, 1, now=at(12), launched_at=at(0), stall_timeout=600, startup_timeout=600, last_step=30
    )
    assert trouble is not None and trouble.reported_only
    diagnosis = dx.diagnose_job(trouble.facts)
    assert diagnosis.code == code, diagnosis
