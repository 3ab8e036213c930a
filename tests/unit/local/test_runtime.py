"""Pod status as the node agent reports it, and the node objects it registers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpujob.local.agent import nodes
from tpujob.local.agent.runtime import (
    ContainerRuntime,
    PodRuntime,
    Terminated,
    log_tail,
    pod_status,
    restart_delay,
)


def runtime(tmp_path: Path, policy: str = "Never", *, exit_code: int | None = None) -> PodRuntime:
    rt = PodRuntime(
        uid="u",
        namespace="ns",
        name="p",
        node="n",
        directory=tmp_path,
        ip="10.1.1.5",
        restart_policy=policy,
        started_at=100.0,
        netns="x",
    )
    c = ContainerRuntime(name="main", image="img", directory=tmp_path / "containers" / "main")
    if exit_code is not None:
        c.terminated = Terminated(
            exit_code, "Completed" if exit_code == 0 else "Error", "msg", 100.0, 110.0
        )
    rt.containers.append(c)
    return rt


@pytest.mark.parametrize(
    ("policy", "exit_code", "phase"),
    [
        ("Never", 0, "Succeeded"),
        ("Never", 3, "Failed"),
        ("OnFailure", 0, "Succeeded"),
        ("OnFailure", 3, "Running"),
        ("Always", 0, "Running"),
    ],
    ids=str,
)
def test_phase_follows_restart_policy(
    tmp_path: Path, policy: str, exit_code: int, phase: str
) -> None:
    assert runtime(tmp_path, policy, exit_code=exit_code).phase() == phase


def test_terminated_container_status_carries_exit_code_reason_and_message(tmp_path: Path) -> None:
    status = pod_status(runtime(tmp_path, exit_code=3), {}, now=120.0)
    state = status["containerStatuses"][0]["state"]["terminated"]
    assert (state["exitCode"], state["reason"], state["message"]) == (3, "Error", "msg")
    assert status["phase"] == "Failed"
    assert status["podIP"] == "10.1.1.5"


def test_status_keeps_conditions_other_components_own(tmp_path: Path) -> None:
    previous = {
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"},
        ]
    }
    kinds = [c["type"] for c in pod_status(runtime(tmp_path), previous, now=1.0)["conditions"]]
    assert "DisruptionTarget" in kinds
    assert "PodScheduled" in kinds
    assert "Ready" in kinds


def test_crash_looping_container_waits_and_shows_last_state(tmp_path: Path) -> None:
    status = pod_status(runtime(tmp_path, "Always", exit_code=2), {}, now=1.0)
    container = status["containerStatuses"][0]
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert container["lastState"]["terminated"]["exitCode"] == 2


def test_restart_backoff_doubles_up_to_a_cap() -> None:
    delays = [restart_delay(n) for n in range(1, 10)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0]
    assert max(delays) == 30.0
    assert delays == sorted(delays)


def test_log_tail_keeps_the_last_lines_within_the_byte_limit(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    tail = log_tail(log, lines=80, limit=2048)
    assert tail.endswith("line 999\n")
    assert len(tail.splitlines()) == 80
    assert len(log_tail(log, lines=1000, limit=100).encode()) <= 100


def test_tpu_pools_have_one_node_per_host_with_the_chips_of_a_host() -> None:
    planned = nodes.plan_nodes(2, "tpu-v5-lite-podslice", "4x4", spare_nodes=1)
    tpu = [n for n in planned if n.tpu_chips]
    assert len(tpu) == 8  # 4x4 = 16 chips = 4 hosts of 4 chips, per pool
    assert {n.labels[nodes.LABEL_NODEPOOL] for n in tpu} == {"tpu-pool-0", "tpu-pool-1"}
    assert all(n.labels[nodes.LABEL_TOPOLOGY] == "4x4" for n in tpu)
    assert all(nodes.TPU_TAINT in n.taints for n in tpu)
    assert [n.name for n in planned if not n.tpu_chips] == ["cpu-pool-w0"]


def test_unhealthy_tpu_node_reports_zero_allocatable_and_only_standard_conditions() -> None:
    node = nodes.plan_nodes(1, "tpu-v4-podslice", "2x2x2", spare_nodes=0)[0]
    status = nodes.node_status(node, now="t", tpu_healthy=False, log_port=1, ready_since="t")
    assert status["allocatable"][nodes.TPU_RESOURCE] == "0"
    assert status["capacity"][nodes.TPU_RESOURCE] == "4"
    # The device plugin's verdict shows as allocatable, as on GKE; no invented condition.
    assert {c["type"] for c in status["conditions"]} <= {
        "Ready",
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "NetworkUnavailable",
    }


@pytest.mark.parametrize(("limit_mib", "oom"), [(64, True), (1024, False)], ids=["over", "under"])
def test_a_container_over_its_memory_limit_is_killed_as_oomkilled(
    tmp_path: Path, limit_mib: int, oom: bool
) -> None:
    import sys
    import time

    c = ContainerRuntime(
        name="main", image="img", directory=tmp_path / "c", memory_limit=limit_mib << 20
    )
    # A child holds 200 MiB: the limit counts the whole process tree, as a cgroup does.
    hog = (
        "import subprocess,sys; subprocess.run([sys.executable, '-c', "
        "'import time; b = bytearray(200 << 20); time.sleep(30)'], timeout=60)"
    )
    c.start([sys.executable, "-c", hog], {}, now=0.0)
    deadline = time.monotonic() + 20
    while c.terminated is None and time.monotonic() < deadline:
        c.poll(now=1.0)
        time.sleep(0.2)
        if not oom and time.monotonic() > deadline - 15:
            break
    if oom:
        assert c.terminated is not None
        assert (c.terminated.reason, c.terminated.exit_code) == ("OOMKilled", 137)
    else:
        assert c.terminated is None
        c.kill_all()
