"""The training's health in the job's conditions, from the one heartbeat the job writes."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, running_status, trainer_message

from tpujob.api import ConditionStatus, Phase, contract
from tpujob.plan.planner import plan


def health_beat(**notes: str) -> dict[str, Any]:
    beat = lease(renewed=100, step=40)
    beat["metadata"]["annotations"].update({contract.HEARTBEAT_HEALTH_STEP: "40", **notes})
    return beat


def condition(result: Any, kind: str) -> Any:
    return next((c for c in result.status.conditions if c.type == kind), None)


@pytest.mark.parametrize(
    ("notes", "kind", "expected", "says"),
    [
        (
            {
                contract.HEARTBEAT_INPUT_BOUND_FRACTION: "0.6",
                contract.HEARTBEAT_WORKER_INPUT_BOUND: "0.6,0.6",
            },
            "InputBound",
            True,
            "prefetch",
        ),
        (
            {
                contract.HEARTBEAT_INPUT_BOUND_FRACTION: "0.05",
                contract.HEARTBEAT_WORKER_INPUT_BOUND: "0.05,0.05",
            },
            "InputBound",
            None,
            "",
        ),
        ({contract.HEARTBEAT_WORKER_STEP_SECONDS: "0.10,0.40"}, "Straggler", True, "pool-0-w1"),
        ({contract.HEARTBEAT_WORKER_STEP_SECONDS: "0.10,0.11"}, "Straggler", None, ""),
        ({contract.HEARTBEAT_INPUT_BOUND_FRACTION: "nan"}, "InputBound", None, ""),
    ],
    ids=["input-bound", "not-input-bound", "straggler", "even", "garbage"],
)
def test_health_numbers_become_conditions_without_a_restart(
    notes: dict[str, str], kind: str, expected: bool | None, says: str
) -> None:
    job = job_body(status=running_status(startTime="2026-01-01T12:00:00Z"))
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    result = plan(observed(job, pods, heartbeat=health_beat(**notes)), now=at(105))
    assert result.status.attempt == 1 and not result.delete_pods
    found = condition(result, kind)
    if expected is None:
        assert found is None or found.status == ConditionStatus.FALSE
    else:
        assert found is not None and found.status == ConditionStatus.TRUE
        assert says in (found.message or "")
        assert any(e.reason == kind for e in result.events)


def test_a_host_oom_that_memory_growth_predicted_is_a_leak_and_fatal_when_it_repeats() -> None:
    warned = {
        "type": "HostMemoryGrowing",
        "status": "True",
        "reason": "GrowingWithoutLimit",
        "message": "worker RSS grows 40 MiB/min",
        "lastTransitionTime": "2026-01-01T12:00:00Z",
    }
    oom = trainer_message(contract.ExitCode.HOST_OOM, "MemoryError", step=None)
    job = job_body(status=running_status(conditions=[warned]))
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=22, message=oom)]
    first = plan(observed(job, pods), now=at(20))
    assert first.status.phase is Phase.RECOVERING
    assert first.status.last_failure is not None
    assert "leak" in first.status.last_failure.summary
    again_status = first.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    again_status["currentAttempt"]["launchedTime"] = "2026-01-01T12:00:30Z"
    again = job_body(status=again_status)
    pods = [
        pod(again, 2, 0, 0, node_name="pool-1-w0"),
        pod(again, 2, 0, 1, phase="Failed", exit_code=22, message=oom, node_name="pool-1-w1"),
    ]
    second = plan(observed(again, pods), now=at(60))
    assert second.status.phase is Phase.FAILED
    assert second.status.last_failure is not None
    assert "leaks" in second.status.last_failure.summary


def test_memory_growth_is_projected_to_the_spec_s_memory_limit() -> None:
    """The spec's trainer memory is the limit the OOM kill comes at; steady growth that will
    reach it within minutes is warned of with the time left."""
    mib = 1 << 20
    samples = [
        {"time": t, "rssBytes": m * mib, "step": s}
        for t, m, s in ((0, 500, 10), (30, 600, 20), (60, 700, 30))
    ]
    status = running_status(startTime="2026-01-01T12:00:00Z")
    status["currentAttempt"]["memorySamples"] = samples
    job = job_body(status=status)
    job["spec"]["trainer"]["resources"] = {"memory": "1536Mi"}
    beat = health_beat(**{contract.HEARTBEAT_WORKER_RSS_BYTES: f"{830 * mib},{400 * mib}"})
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    result = plan(observed(job, pods, heartbeat=beat), now=at(105))
    found = condition(result, "HostMemoryGrowing")
    assert found is not None and found.status == ConditionStatus.TRUE, result.status.conditions
    assert found.reason == "GrowingTowardsLimit"
    assert "limit of 1536 MiB" in (found.message or "")
    assert not result.delete_pods
