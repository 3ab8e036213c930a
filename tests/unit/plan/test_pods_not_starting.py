"""A pod whose container does not start: refused by the kubelet (a pull it cannot do, a missing
Secret) it is a failure diagnosed from the kubelet's reason and message; waiting without a
cause (ContainerCreating, a pull back-off) it is named in the Running condition, not failed."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, iso, job_body, observed, pod, running_status

from tpujob.api import ConditionType, Phase
from tpujob.api.reasons import ConditionReason
from tpujob.observed.trouble import FAILED_START_GRACE_SECONDS
from tpujob.plan.planner import plan
from tpujob.plan.starting import NOT_STARTED_GRACE_SECONDS


def waiting(manifest: dict[str, Any], reason: str, message: str = "") -> dict[str, Any]:
    """The pod on its node since T0 with its container waiting for `reason`."""
    state: dict[str, Any] = {"reason": reason}
    if message:
        state["message"] = message
    manifest["status"] = {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(at(0))}
        ],
        "containerStatuses": [{"name": "trainer", "state": {"waiting": state}}],
    }
    return manifest


def starting_job() -> dict[str, Any]:
    status = running_status()
    status["phase"] = "Starting"
    return job_body(status=status)


def planned(reason: str, message: str, seconds: float) -> Any:
    job = starting_job()
    pods = [pod(job, 1, 0, 0), waiting(pod(job, 1, 0, 1), reason, message)]
    return plan(observed(job, pods), now=at(seconds))


NOT_FOUND = (
    'rpc error: code = NotFound desc = failed to pull and unpack image "r.example/x:v9": '
    'failed to resolve reference "r.example/x:v9": r.example/x:v9: not found'
)


@pytest.mark.parametrize(
    ("reason", "message", "failure_class", "code"),
    [
        ("ErrImagePull", NOT_FOUND, "fatal", "IMAGE_PULL_FAILED"),
        ("InvalidImageName", 'couldn\'t parse image reference "r.example/X:v1"', "fatal", None),
        (
            "ErrImagePull",
            'failed to pull image "r.example/x:v1": Get "https://r.example/v2/": net/http: '
            "TLS handshake timeout",
            "medium",
            "IMAGE_PULL_FAILED",
        ),
        (
            "CreateContainerConfigError",
            "couldn't find key token in Secret team/hf",
            "fatal",
            "CONFIG_ERROR",
        ),
    ],
)
def test_a_container_the_kubelet_cannot_start_is_a_failure_diagnosed_from_its_reason(
    reason: str, message: str, failure_class: str, code: str | None
) -> None:
    early = planned(reason, message, FAILED_START_GRACE_SECONDS - 5)
    assert early.diagnosis is None
    result = planned(reason, message, FAILED_START_GRACE_SECONDS + 1)
    assert result.diagnosis is not None
    assert result.diagnosis.failure_class.value == failure_class
    if code is not None:
        assert result.diagnosis.code.value == code
    if failure_class == "fatal":
        assert result.status.phase is Phase.FAILED
        failed = result.status.condition(ConditionType.FAILED)
        assert failed is not None and reason in (failed.message or "") + str(
            result.status.last_failure
        )


@pytest.mark.parametrize(
    ("reason", "message", "hint"),
    [
        ("ContainerCreating", "", "FailedMount"),
        ("ImagePullBackOff", 'Back-off pulling image "r.example/x:v1"', "retries pulling"),
    ],
)
def test_a_container_waiting_without_a_cause_is_named_once_its_grace_is_over_not_failed(
    reason: str, message: str, hint: str
) -> None:
    early = planned(reason, message, NOT_STARTED_GRACE_SECONDS - 10)
    assert early.diagnosis is None
    said = early.status.condition(ConditionType.RUNNING)
    assert said is None or said.reason != ConditionReason.NOT_STARTED
    assert early.requeue_after <= 10 + 1e-6
    late = planned(reason, message, NOT_STARTED_GRACE_SECONDS + 30)
    assert late.diagnosis is None and late.status.phase is not Phase.FAILED
    said = late.status.condition(ConditionType.RUNNING)
    assert said is not None and said.reason == ConditionReason.NOT_STARTED
    assert said.message is not None
    assert said.message.startswith("pod train-1-0-1: its container has not started on node ")
    assert reason in said.message and hint in said.message
    # The same words later: no status write for the clock alone.
    again = planned(reason, message, NOT_STARTED_GRACE_SECONDS + 90)
    told = again.status.condition(ConditionType.RUNNING)
    assert told is not None and told.message == said.message
