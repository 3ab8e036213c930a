"""A non-finite loss rolls back past the data that led to it, a bounded number of times."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, job_body, observed, pod, running_status

from tpujob.api import Phase, contract
from tpujob.plan.planner import plan
from tpujob.plan.rollback import NAN_ADVICE, plan_rollback


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ((120, 110, None), (110, 10, "110:10")),
        ((120, 120, None), (0, 120, "0:120")),  # a checkpoint at the anomaly may be poisoned
        ((120, None, None), (0, 120, "0:120")),  # nothing committed before it: start over
        ((57, 50, "110:10"), (50, 7, "110:10,50:7")),  # earlier windows are kept
        ((None, 30, None), (30, 1, "30:1")),  # no step reported: skip the next batch
    ],
    ids=str,
)
def test_the_rollback_resumes_before_the_anomaly_and_skips_the_window(
    given: tuple[int | None, int | None, str | None], expected: tuple[int, int, str]
) -> None:
    nan_step, checkpoint, windows = given
    rollback = plan_rollback(nan_step=nan_step, checkpoint_step=checkpoint, windows=windows, done=0)
    assert (rollback.resume_step, rollback.skip, rollback.windows) == expected
    assert rollback.count == 1


def nan_at(job: dict[str, Any], step: int, checkpoint: int) -> list[dict[str, Any]]:
    message = contract.encode_termination_message(
        contract.TerminationMessage(
            code="NAN_LOSS",
            exit_code=int(contract.ExitCode.NON_FINITE_LOSS),
            class_hint=contract.ClassHint.MEDIUM,
            summary=f"loss is nan at step {step}",
            step=step,
            checkpoint_step=checkpoint,
        )
    )
    code = int(contract.ExitCode.NON_FINITE_LOSS)
    return [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=code, message=message)]


def env_of(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in manifest["spec"]["containers"][0]["env"]}


def test_a_nan_loss_restarts_from_the_checkpoint_before_it_skipping_its_data() -> None:
    job = job_body(status=running_status())
    result = plan(observed(job, nan_at(job, 120, 110)), now=at(20))
    assert result.status.phase is Phase.RECOVERING
    assert result.status.nan_rollbacks == 1
    assert result.status.skip_batches == "110:10"
    assert result.status.current_attempt.rollback_step == 110
    assert "rolled back to step 110, skipping 10 batches" in result.status.timeline[-1].message
    launch_status = result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    launch_status["currentAttempt"].pop("notBefore", None)
    launched = plan(observed(job_body(status=launch_status), []), now=at(60))
    pods = [o for o in launched.create if o["kind"] == "Pod"]
    assert pods
    assert all(env_of(p)[contract.ENV_RESUME_STEP] == "110" for p in pods)
    assert all(env_of(p)[contract.ENV_SKIP_BATCHES] == "110:10" for p in pods)


def test_a_nan_loss_after_every_rollback_fails_the_job_with_advice() -> None:
    job = job_body(
        status=running_status(nanRollbacks=2, skipBatches="110:10,110:10"),
        recovery={"maxNanRollbacks": 2},
    )
    result = plan(observed(job, nan_at(job, 120, 110)), now=at(20))
    assert result.status.phase is Phase.FAILED
    failed = next(c for c in result.status.conditions if c.type == "Failed")
    assert failed.reason == "NonFiniteLossRepeated"
    assert NAN_ADVICE[:40] in (failed.message or "")
