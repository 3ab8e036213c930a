"""The node agent's pod status matches what a real kubelet posted on kind for the same pod
(hack/kubelet-fidelity.py, docs/kubelet-fidelity.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.local.test_runtime import runtime as base_runtime

from tpujob.local.agent.runtime import PodRuntime, Terminated, pod_status


def runtime(tmp_path: Path, terminated: Terminated | None) -> PodRuntime:
    """A one-container pod: running when `terminated` is None, else ended so."""
    rt = base_runtime(tmp_path)
    c = rt.containers[0]
    if terminated is None:
        c.proc = object()  # type: ignore[assignment]  # running: a process, not yet reaped
        c.started_at = 100.0
    else:
        rt.netns = ""  # a finished pod's sandbox is gone
    c.terminated = terminated
    return rt


def conditions(status: dict[str, object]) -> set[str]:
    out = set()
    for c in status["conditions"]:  # type: ignore[attr-defined]
        out.add(f"{c['type']}={c['status']}" + (f" ({c['reason']})" if c.get("reason") else ""))
    return out


@pytest.mark.parametrize(
    ("exit_code", "reason", "expected"),
    [
        (
            0,
            "Completed",
            {
                "ContainersReady=False (PodCompleted)",
                "Initialized=True (PodCompleted)",
                "PodReadyToStartContainers=False",
                "PodScheduled=True",
                "Ready=False (PodCompleted)",
            },
        ),
        (
            3,
            "Error",
            {
                "ContainersReady=False (PodFailed)",
                "Initialized=True",
                "PodReadyToStartContainers=False",
                "PodScheduled=True",
                "Ready=False (PodFailed)",
            },
        ),
    ],
    ids=["succeeded", "failed"],
)
def test_a_finished_pod_has_the_kubelets_conditions(
    tmp_path: Path, exit_code: int, reason: str, expected: set[str]
) -> None:
    rt = runtime(tmp_path, Terminated(exit_code, reason, "", 100.0, 110.0))
    assert conditions(pod_status(rt, {}, now=120.0)) == expected


def test_a_running_pod_is_scheduled_and_ready(tmp_path: Path) -> None:
    status = pod_status(runtime(tmp_path, None), {}, now=120.0)
    assert conditions(status) == {
        "ContainersReady=True",
        "Initialized=True",
        "PodReadyToStartContainers=True",
        "PodScheduled=True",
        "Ready=True",
    }


def test_a_killed_container_shows_the_signal_only_in_its_exit_code(tmp_path: Path) -> None:
    # The kubelet never fills `signal`: a SIGKILL from outside reads exit 137, reason Error.
    rt = runtime(tmp_path, Terminated(137, "Error", "", 100.0, 110.0, signal=9))
    state = pod_status(rt, {}, now=120.0)["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"]) == (137, "Error")
    assert "signal" not in state
