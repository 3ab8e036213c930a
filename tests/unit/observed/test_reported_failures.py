"""Failure reports on the heartbeat Lease: which are read, which pods they attach to, and the
facts the diagnosis gets from them."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, reported, running_status

from tpujob.api import contract
from tpujob.observed.trouble import find_trouble
from tpujob.observed.views import failure_reports


def body() -> dict[str, Any]:
    return lease(renewed=9, step=30)


@pytest.mark.parametrize(
    ("key", "value", "found"),
    [
        ("tpujob.dev/failed-0-1", "REPORT", {(0, 1)}),
        ("tpujob.dev/failed-2-15", "REPORT", {(2, 15)}),
        ("tpujob.dev/failed-x-1", "REPORT", set()),
        ("tpujob.dev/failed-0", "REPORT", set()),
        ("tpujob.dev/failed-0-1", "not a report", set()),
        ("tpujob.dev/failed-0-999999999", "REPORT", set()),
        ("example.com/failed-0-1", "REPORT", set()),
    ],
)
def test_only_well_formed_reports_under_a_workers_key_are_read(
    key: str, value: str, found: set[tuple[int, int]]
) -> None:
    text = reported(body(), 0, 0)["metadata"]["annotations"][contract.failure_annotation(0, 0)]
    notes = {key: text if value == "REPORT" else value}
    assert set(failure_reports(notes)) == found


def test_a_report_attaches_to_the_running_pod_of_its_worker_and_attempt() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    seen = observed(job, pods, heartbeat=reported(body(), 0, 1, exit_code=3, message="boom"))
    by_name = {p.name: p.reported for p in seen.pods}
    assert by_name["train-1-0-0"] is None
    report = by_name["train-1-0-1"]
    assert report is not None and (report.exit_code, report.message) == (3, "boom")


def test_a_pod_that_ended_keeps_the_kubelets_record_and_no_report() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=9)]
    seen = observed(job, pods, heartbeat=reported(body(), 0, 1, exit_code=3))
    assert all(p.reported is None for p in seen.pods)


def test_a_reported_failure_gives_the_diagnosis_what_a_terminated_container_would() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    beat = reported(body(), 0, 1, exit_code=137, at_seconds=10, message="killed")
    seen = observed(job, pods, heartbeat=beat, logs={"train-1-0-1": "last words"})
    trouble = find_trouble(
        seen, 1, now=at(12), launched_at=at(0), stall_timeout=600, startup_timeout=600, last_step=30
    )
    assert trouble is not None and trouble.reported_only
    assert trouble.pods == ("train-1-0-1",) and trouble.seen_at == at(10)
    (worker,) = trouble.facts.workers
    assert (worker.exit_code, worker.signal, worker.reason) == (137, 9, "Error")
    assert (worker.message, worker.log_tail) == ("killed", "last words")
    assert "supervisor" in worker.context


def test_a_report_dated_ahead_of_the_operators_clock_is_dated_now() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    seen = observed(job, pods, heartbeat=reported(body(), 0, 1, at_seconds=500))
    trouble = find_trouble(
        seen, 1, now=at(12), launched_at=at(0), stall_timeout=600, startup_timeout=600, last_step=30
    )
    assert trouble is not None and trouble.seen_at == at(12)


def test_a_pod_that_ended_beside_a_reported_one_is_no_restart_in_place() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0, phase="Failed", exit_code=137), pod(job, 1, 0, 1)]
    seen = observed(job, pods, heartbeat=reported(body(), 0, 1, exit_code=137))
    trouble = find_trouble(
        seen, 1, now=at(12), launched_at=at(0), stall_timeout=600, startup_timeout=600, last_step=30
    )
    assert trouble is not None and not trouble.reported_only
    assert sorted(trouble.pods) == ["train-1-0-0", "train-1-0-1"]
