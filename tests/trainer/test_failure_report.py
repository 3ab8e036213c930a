"""The supervisor's failure report: what it says of an ended process, its cgroup's OOM kills,
and which pods' environments can send one."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tpujob_trainer import contract, failure_report

pytestmark = pytest.mark.trainer

ENV = {
    contract.ENV_HEARTBEAT_LEASE: "job-heartbeat",
    contract.ENV_NAMESPACE: "team-a",
    contract.ENV_JOB_UID: "uid-1",
    failure_report.ENV_SLICE: "1",
    failure_report.ENV_WORKER: "3",
}


@pytest.mark.parametrize(
    ("returncode", "before", "after", "expected"),
    [
        (-9, 0, 1, (137, 9, "OOMKilled")),
        (-9, 2, 2, (137, 9, "Error")),
        (-9, None, None, (137, 9, "Error")),
        (31, 0, 0, (31, None, "Error")),
    ],
)
def test_a_report_says_what_a_terminated_containers_status_would(
    tmp_path: Path,
    returncode: int,
    before: int | None,
    after: int | None,
    expected: tuple[int, int | None, str],
) -> None:
    message = tmp_path / "message"
    message.write_text('{"code":"X"}')
    env = {**ENV, contract.ENV_TERMINATION_MESSAGE_PATH: str(message)}
    report = failure_report.report_of(
        env,
        attempt=4,
        returncode=returncode,
        oom_before=before,
        oom_after=after,
        now=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    assert (report.exit_code, report.signal, report.reason) == expected
    assert (report.attempt, report.job_uid, report.message) == (4, "uid-1", '{"code":"X"}')
    assert report.at == "2026-01-02T03:04:05Z"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"memory.events": "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n"}, 2),
        ({"memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"}, 5),
        ({"memory.events": "oom 1\n"}, None),
        ({}, None),
    ],
)
def test_oom_kills_are_read_from_cgroup_v2_then_v1(
    tmp_path: Path, files: dict[str, str], expected: int | None
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    counters = (tmp_path / "memory.events", tmp_path / "memory.oom_control")
    assert failure_report.oom_kills(counters) == expected


@pytest.mark.parametrize(
    "missing",
    [
        contract.ENV_HEARTBEAT_LEASE,
        contract.ENV_NAMESPACE,
        contract.ENV_JOB_UID,
        failure_report.ENV_SLICE,
        failure_report.ENV_WORKER,
    ],
)
def test_a_pod_without_what_a_report_needs_sends_none(missing: str) -> None:
    assert failure_report.lease_reporter(ENV) == failure_report.LeaseReporter(
        "job-heartbeat", "team-a", 1, 3
    )
    assert failure_report.lease_reporter({k: v for k, v in ENV.items() if k != missing}) is None


def test_a_report_the_api_refuses_is_no_report() -> None:
    # No cluster credentials here: the client cannot be made, and the pod ends as before.
    reporter = failure_report.LeaseReporter("job-heartbeat", "team-a", 0, 0)
    report = contract.FailureReport(1, "uid", 1, None, "Error", "", "2026-01-01T00:00:00Z")
    assert reporter(report) is False
