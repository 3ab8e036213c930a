"""The operator keeps real JAX training going through real faults on the local cluster.

Each test submits a TPUTrainingJob whose trainer is the real multi-process JAX trainer with
orbax checkpoints, makes a real fault happen (a process killed, a node down, a TPU reported
unhealthy, a real shape error...), and checks the end phase, the restart counts, that training
resumed no earlier than the last checkpoint, and the recovery timeline.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, wait_for
from tests.e2e.operator_fixture import OperatorProcess, job_status, wait_status

from tpujob.api import GROUP, PLURAL, VERSION, labels

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]
RUN_TIMEOUT = 300
# Steps of a job that gets a fault while it trains: enough left after the fault point that
# training cannot finish before a fault applied through the node agent (a second or more on
# a loaded machine) lands.
FAULTED_STEPS = 150


def training_job(
    name: str,
    checkpoints: Path,
    *,
    steps: int = 60,
    faults: tuple[str, ...] = (),
    slices: int = 1,
    step_time: float = 0.1,
    **recovery: Any,
) -> dict[str, Any]:
    args = [
        "--steps",
        str(steps),
        "--step-time",
        str(step_time),
        "--batch-size",
        "16",
        "--log-every",
        "5",
    ]
    for fault in faults:
        args += ["--fault", fault]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "framework": "jax",
            "tpu": {"accelerator": "tpu-v4-podslice", "topology": "2x2x2", "slices": slices},
            "trainer": {
                "image": "local",
                "command": ["tpujob-trainer"],
                "args": args,
                "allowCpuFallback": True,
                "totalSteps": steps,
            },
            "checkpoint": {
                "volume": {"hostPath": str(checkpoints), "mountPath": "/checkpoints"},
                "intervalSteps": 10,
                "keep": 3,
            },
            "recovery": {
                "maxFailedNodes": 1,
                "backoff": {"initialSeconds": 1, "maxSeconds": 4},
                "stallTimeoutSeconds": 20,
                **recovery,
            },
        },
    }


class Run:
    """One submitted job and the handles a test needs around it."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str,
        operator: OperatorProcess | None,
        body: dict[str, Any],
    ) -> None:
        self.cluster, self.namespace, self.operator = cluster, namespace, operator
        self.name = body["metadata"]["name"]
        api = cluster.api_client()
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def status(self) -> dict[str, Any]:
        return job_status(self.custom, self.namespace, self.name)

    def wait(self, check: Any, what: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
        return wait_status(
            self.custom,
            self.namespace,
            self.name,
            check,
            timeout=timeout,
            what=what,
            operator=self.operator,
        )

    def wait_training(self, attempt: int = 1, step: int = 12) -> dict[str, Any]:
        return self.wait(
            lambda s: (
                s.get("attempt") == attempt
                and s.get("phase") == "Running"
                and (s.get("progress") or {}).get("step", 0) >= step
            ),
            f"attempt {attempt} training past step {step}",
        )

    def wait_phase(self, phase: str, timeout: float = RUN_TIMEOUT) -> dict[str, Any]:
        return self.wait(lambda s: s.get("phase") == phase, f"phase {phase}", timeout)

    def pods(self, attempt: int | None = None) -> list[Any]:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{labels.JOB}={self.name}"
        ).items
        return [
            p
            for p in pods
            if attempt is None or p.metadata.labels.get(labels.ATTEMPT) == str(attempt)
        ]

    def node_of(self, attempt: int, slice_index: int, worker: int) -> str:
        pod = next(
            p
            for p in self.pods(attempt)
            if p.metadata.labels[labels.SLICE] == str(slice_index)
            and p.metadata.labels[labels.WORKER] == str(worker)
        )
        return str(pod.spec.node_name)

    def events(self) -> list[str]:
        items = self.core.list_namespaced_event(self.namespace).items
        return [str(e.message) for e in items if e.involved_object.name == self.name]

    def told(self, check: Any, timeout: float = 30) -> list[str]:
        """This job's Event messages that satisfy `check`, waiting for one up to `timeout`.
        The operator tells Events after the status write they belong to, so a test that just
        saw that status may look a moment before the Event exists."""
        return list(
            wait_for(
                lambda: [m for m in self.events() if check(m)],
                timeout=timeout,
                what=f"an Event of {self.name} as expected",
            )
        )


def timeline_kinds(status: dict[str, Any]) -> list[str]:
    return [e["kind"] for e in status.get("timeline", [])]


def assert_recovered(
    status: dict[str, Any], *, soft: int = 0, medium: int = 0, hard: int = 0
) -> None:
    restarts = status["restarts"]
    assert (restarts["soft"], restarts["medium"], restarts["hard"]) == (soft, medium, hard), (
        f"last failure {status.get('lastFailure')}; timeline {status.get('timeline')}"
    )
    kinds = timeline_kinds(status)
    for kind in ("FailureSeen", "Diagnosed", "Restarting", "PodsCreated", "Resumed"):
        assert kind in kinds, f"{kind} missing from timeline {kinds}"
    assert kinds.index("FailureSeen") < kinds.index("Resumed")


def resumed_from_checkpoint(run: Run, failed_at_checkpoint: int | None) -> None:
    """The new attempt's first reported step is no earlier than the checkpoint before it."""
    status = run.status()
    resumed = status["currentAttempt"].get("resumedStep")
    assert resumed is not None
    assert failed_at_checkpoint is not None
    assert resumed >= failed_at_checkpoint


def test_happy_path_trains_to_the_end_with_a_live_heartbeat(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, training_job("happy", tmp_path, steps=40))
    run.wait_training(step=5)
    coordination = client.CoordinationV1Api(cluster.api_client())
    first = coordination.read_namespaced_lease("happy-heartbeat", namespace).spec.renew_time
    time.sleep(2.5)
    second = coordination.read_namespaced_lease("happy-heartbeat", namespace).spec.renew_time
    assert second > first
    status = run.wait_phase("Succeeded")
    assert status["restarts"]["total"] == 0
    assert status["progress"]["step"] == 40
    assert status["checkpointStep"] >= 30
    assert 0 < status["goodput"] <= 1
    assert timeline_kinds(status)[:2] == ["Started", "PodsCreated"]


def test_worker_killed_is_a_soft_restart_from_the_checkpoint(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, training_job("soft", tmp_path, steps=FAULTED_STEPS))
    before = run.wait_training(step=22)
    cluster.tpujob("local", "fault", "kill", "soft-1-0-1", "-n", namespace)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    assert status["lastFailure"]["class"] == "soft"
    assert status["lastFailure"]["pod"] == "soft-1-0-1"
    resumed_from_checkpoint(run, before.get("checkpointStep"))
    assert any(m.startswith("[SOFT]") for m in run.events())


def test_collective_timeout_is_a_medium_restart_with_a_longer_timeout(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(
        cluster,
        namespace,
        operator,
        training_job("medium", tmp_path, faults=("exit-code=31@25:worker=0:attempt=1",)),
    )
    status = run.wait_phase("Succeeded")
    assert_recovered(status, medium=1)
    assert status["lastFailure"]["code"] == "COLLECTIVE_TIMEOUT"
    assert status["currentAttempt"]["collectiveTimeoutSeconds"] == 30  # doubled from 15
    env = {e.name: e.value for e in run.pods(2)[0].spec.containers[0].env}
    assert env["TPUJOB_COLLECTIVE_TIMEOUT_SECONDS"] == "30"


def test_node_down_taints_the_node_moves_the_slice_and_untaints_it_once_back(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    run = Run(cluster, namespace, operator, training_job("hard", tmp_path, steps=FAULTED_STEPS))
    before = run.wait_training(step=22)
    node = run.node_of(1, 0, 1)
    old_pool = before["currentAttempt"]["placement"][0]["nodePool"]
    cluster.tpujob("local", "fault", "node-down", node)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    assert [n["name"] for n in status["failedNodes"]] == [node]
    assert status["failedNodeBudgetLeft"] == 0
    assert status["lastFailure"]["code"] == "NODE_LOST"
    assert status["currentAttempt"]["placement"][0]["nodePool"] != old_pool
    taints = {t.key for t in core.read_node(node).spec.taints or []}
    assert labels.BAD_NODE_TAINT in taints
    resumed_from_checkpoint(run, before.get("checkpointStep"))
    # The node comes back, the same Node object, and stays Ready: the job that marked it, though
    # finished, takes its mark off (after the operator's --lost-node-return) and still counts it.
    cluster.tpujob("local", "fault", "node-up", node)

    def unmarked() -> bool:
        back = core.read_node(node)
        return labels.BAD_NODE_TAINT not in {t.key for t in back.spec.taints or []} and (
            labels.BAD_NODE_REASON not in (back.metadata.annotations or {})
        )

    wait_for(unmarked, timeout=120, what="the job's mark taken off the node that came back")
    assert [n["name"] for n in run.status()["failedNodes"]] == [node]


def test_unhealthy_tpu_is_hard_and_blames_that_node(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, training_job("tpu", tmp_path, steps=FAULTED_STEPS))
    run.wait_training(step=15)
    node = run.node_of(1, 0, 0)
    cluster.tpujob("local", "fault", "tpu-unhealthy", node)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    assert status["lastFailure"]["code"] == "TPU_UNHEALTHY"
    assert [n["name"] for n in status["failedNodes"]] == [node]


def test_shape_mismatch_is_fatal_at_once_with_advice(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, training_job("shape", tmp_path, faults=("shape@8",)))
    status = run.wait_phase("Failed")
    assert status["attempt"] == 1
    assert status["restarts"]["total"] == 0
    assert status["lastFailure"]["class"] == "fatal"
    assert status["lastFailure"]["code"] == "SHAPE_MISMATCH"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FatalFailure"
    run.told(lambda m: m.startswith("[FATAL] SHAPE_MISMATCH"))


def test_the_same_failure_at_the_same_step_twice_becomes_fatal(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(
        cluster,
        namespace,
        operator,
        training_job("repeat", tmp_path, faults=("exit-code=1@15:worker=0",)),
    )
    status = run.wait_phase("Failed")
    assert status["attempt"] == 2
    assert status["lastFailure"]["code"] == "DETERMINISTIC_REPEAT"
    assert "same" in status["lastFailure"]["summary"].lower()


def test_failed_node_budget_exceeded_fails_the_job(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, training_job("budget", tmp_path, steps=400))
    run.wait_training(step=12)
    cluster.tpujob("local", "fault", "node-down", run.node_of(1, 0, 0))
    run.wait_training(attempt=2, step=1)
    cluster.tpujob("local", "fault", "node-down", run.node_of(2, 0, 1))
    status = run.wait_phase("Failed")
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailedNodeBudgetExceeded"
    assert status["restarts"]["hard"] == 1
    assert len(status["failedNodes"]) == 1


def test_stalled_heartbeat_is_recovered_as_a_hang(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(
        cluster,
        namespace,
        operator,
        training_job(
            "hang", tmp_path, faults=("hang@18:worker=1:attempt=1",), stallTimeoutSeconds=15
        ),
    )
    status = run.wait_phase("Succeeded")
    assert status["lastFailure"]["code"] == "HANG"
    assert status["restarts"]["total"] == 1


def test_maintenance_sigterm_saves_and_resumes_from_that_step_elsewhere(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    run = Run(
        cluster, namespace, operator, training_job("maint", tmp_path, steps=120, step_time=0.15)
    )
    before = run.wait_training(step=14)
    node = run.node_of(1, 0, 0)
    cluster.tpujob("local", "fault", "maintenance", node)
    status = run.wait_phase("Succeeded")
    assert status["failedNodes"] == []
    assert status["lastFailure"]["code"] == "MAINTENANCE"
    assert (
        status["currentAttempt"]["placement"][0]["nodePool"]
        != before["currentAttempt"]["placement"][0]["nodePool"]
    )
    # The old attempt's last save is the one SIGTERM made; the new attempt restored exactly it.
    old_log = cluster.tpujob("local", "logs", "maint-1-0-0", "-n", namespace).stdout
    saved = [int(m) for m in re.findall(r"saving step (\d+)", old_log)]
    new_log = run.core.read_namespaced_pod_log("maint-2-0-0", namespace)
    restored = re.search(r"resumed from step (\d+)", new_log)
    assert saved
    assert restored is not None
    assert int(restored.group(1)) == saved[-1]
    assert saved[-1] >= before["progress"]["step"]


def test_operator_killed_mid_recovery_finishes_it_without_duplicates(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, training_job("crash", tmp_path, steps=FAULTED_STEPS))
    run.wait_training(step=15)
    node = run.node_of(1, 0, 1)
    cluster.tpujob("local", "fault", "node-down", node)
    run.wait(lambda s: s.get("attempt") == 2, "the hard recovery decided", timeout=60)
    operator.kill()
    time.sleep(2)
    operator.start()
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    assert [n["name"] for n in status["failedNodes"]] == [node]
    names = [p.metadata.name for p in run.pods(2)]
    assert sorted(names) == ["crash-2-0-0", "crash-2-0-1"]


def test_two_slice_job_losing_one_slice_moves_only_that_slice(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(
        cluster, namespace, operator, training_job("multi", tmp_path, slices=2, steps=FAULTED_STEPS)
    )
    before = run.wait_training(step=15)
    pools = {p["slice"]: p["nodePool"] for p in before["currentAttempt"]["placement"]}
    cluster.tpujob("local", "fault", "node-down", run.node_of(1, 1, 0))
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    after = {p["slice"]: p["nodePool"] for p in status["currentAttempt"]["placement"]}
    assert after[0] == pools[0]
    assert after[1] != pools[1]


def test_deleting_a_job_removes_its_children(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    run = Run(cluster, namespace, operator, training_job("gone", tmp_path, steps=400))
    run.wait_training(step=3)
    run.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gone")
    wait_for(lambda: not run.pods(), timeout=90, what="pods garbage-collected")
    assert not client.CoreV1Api(cluster.api_client()).list_namespaced_service(namespace).items


def test_a_transient_read_error_restoring_the_newest_step_deletes_nothing_and_resumes_there(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    # Worker 1 dies at step 55 (step 50 the newest checkpoint); restoring step 50 in attempt 2,
    # worker 0 gets one transient read error (an OSError, as from a flaky NFS or GCS read).
    run = Run(
        cluster,
        namespace,
        operator,
        training_job(
            "restore",
            tmp_path,
            steps=FAULTED_STEPS,
            faults=("crash@55:worker=1:attempt=1", "restore-error@50:worker=0:attempt=2"),
        ),
    )
    status = run.wait_phase("Succeeded")
    assert status["restarts"]["total"] == 1, status.get("timeline")
    assert status["currentAttempt"]["resumedStep"] > 50
    log = run.core.read_namespaced_pod_log("restore-2-0-0", namespace)
    assert "checkpoint step 50: transient read error" in log
    assert "moved aside" not in log and "falling back" not in log
    assert not list(tmp_path.rglob("corrupt"))  # nothing was judged corrupt or set aside
