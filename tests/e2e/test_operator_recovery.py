"""The operator keeps real JAX training going through real faults on the local cluster.

Each test submits a TPUTrainingJob whose trainer is the real multi-process JAX trainer with
orbax checkpoints, makes a real fault happen (a process killed, a node down, a TPU reported
unhealthy, a real shape error...), and checks the end phase, the restart counts, that training
resumed no earlier than the last checkpoint, and the recovery timeline.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Scenario:
    """One fault and how the job must come out of it.

    The fault is either the trainer's own (`faults`, `--fault` arguments, at a step) or one the
    local cluster makes (`cluster_fault`: `tpujob local fault KIND` on the pod or the node of
    `target`, a (slice, worker), once attempt 1 trains past `after_step`).
    """

    name: str
    phase: str
    restarts: tuple[int, int, int] | None  # soft, medium, hard; None: `attempt` says enough
    failure: tuple[str, str]  # lastFailure (class, code)
    faults: tuple[str, ...] = ()
    cluster_fault: tuple[str, str] | None = None  # (kind, "pod" | "node")
    target: tuple[int, int] = (0, 0)
    after_step: int = 15
    steps: int = 60
    recovery: dict[str, Any] = field(default_factory=dict)
    attempt: int | None = None  # the attempt it ends in, when that is the point
    blames_node: bool = False  # the target's node is the job's failed node
    condition_reason: str | None = None  # of the Failed condition
    # The environment the retry runs in (what an adjusted retry adjusted), on attempt 2's pods.
    retry_env: dict[str, str] = field(default_factory=dict)


SCENARIOS = [
    Scenario(
        "worker-killed-soft",
        "Succeeded",
        (1, 0, 0),
        ("soft", "PROCESS_KILLED"),
        cluster_fault=("kill", "pod"),
        target=(0, 1),
        after_step=22,
        steps=FAULTED_STEPS,
    ),
    Scenario(
        "collective-timeout-medium",
        "Succeeded",
        (0, 1, 0),
        ("medium", "COLLECTIVE_TIMEOUT"),
        faults=("exit-code=31@25:worker=0:attempt=1",),
        retry_env={"TPUJOB_COLLECTIVE_TIMEOUT_SECONDS": "30"},  # doubled from 15
    ),
    Scenario(
        "tpu-unhealthy-hard",
        "Succeeded",
        (0, 0, 1),
        ("hard", "TPU_UNHEALTHY"),
        cluster_fault=("tpu-unhealthy", "node"),
        steps=FAULTED_STEPS,
        blames_node=True,
    ),
    Scenario(
        "heartbeat-stalled-soft",
        "Succeeded",
        (1, 0, 0),
        ("soft", "HANG"),
        faults=("hang@18:worker=1:attempt=1",),
        recovery={"stallTimeoutSeconds": 15},
    ),
    Scenario(
        "shape-mismatch-fatal-at-once",
        "Failed",
        (0, 0, 0),
        ("fatal", "SHAPE_MISMATCH"),
        faults=("shape@8",),
        attempt=1,
        condition_reason="FatalFailure",
    ),
    Scenario(
        "same-failure-same-step-twice-fatal",
        "Failed",
        None,  # the first failure's grade is the text's guess; that it is retried once matters
        ("fatal", "DETERMINISTIC_REPEAT"),
        faults=("exit-code=1@15:worker=0",),
        attempt=2,
    ),
]


@pytest.mark.parametrize("case", SCENARIOS, ids=[c.name for c in SCENARIOS])
def test_a_fault_is_recovered_as_its_class_says(
    case: Scenario, cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    name = case.name.split("-")[0]
    body = training_job(name, tmp_path, steps=case.steps, faults=case.faults, **case.recovery)
    run = Run(cluster, namespace, operator, body)
    before: dict[str, Any] = {}
    node = ""
    if case.cluster_fault is not None:
        kind, on = case.cluster_fault
        before = run.wait_training(step=case.after_step)
        slice_index, worker = case.target
        node = run.node_of(1, slice_index, worker)
        pod = f"{name}-1-{slice_index}-{worker}"
        where = [pod, "-n", namespace] if on == "pod" else [node]
        cluster.tpujob("local", "fault", kind, *where)
    status = run.wait_phase(case.phase)
    failure = status["lastFailure"]
    assert (failure["class"], failure["code"]) == case.failure, failure
    if case.phase == "Succeeded" and case.restarts is not None:
        soft, medium, hard = case.restarts
        assert_recovered(status, soft=soft, medium=medium, hard=hard)
        assert status["progress"]["step"] == case.steps
    elif case.restarts is not None:
        restarts = status["restarts"]
        assert (restarts["soft"], restarts["medium"], restarts["hard"]) == case.restarts, status
    if case.attempt is not None:
        assert status["attempt"] == case.attempt
    if before.get("checkpointStep") is not None and case.phase == "Succeeded":
        resumed_from_checkpoint(run, before["checkpointStep"])
    failed_nodes = [n["name"] for n in status["failedNodes"]]
    assert failed_nodes == ([node] if case.blames_node else []), status["failedNodes"]
    if case.condition_reason is not None:
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == case.condition_reason, failed
    for pod in run.pods(2) if case.retry_env else ():
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        assert {k: env.get(k) for k in case.retry_env} == case.retry_env, pod.metadata.name
    cls, code = case.failure
    run.told(lambda m: m.startswith(f"[{cls.upper()}] {code}"))


@pytest.mark.long
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


@pytest.mark.long
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
    # Attempt 2's worker 0: its own pod restarted in place (restore-1-0-0, relabelled) after a
    # crash its supervisor reported, or a new pod (restore-2-0-0) when the report was not seen.
    worker0 = next(p for p in run.pods(2) if p.metadata.labels[labels.WORKER] == "0")
    log = run.core.read_namespaced_pod_log(worker0.metadata.name, namespace)
    assert "checkpoint step 50: transient read error" in log
    assert "moved aside" not in log and "falling back" not in log
    assert not list(tmp_path.rglob("corrupt"))  # nothing was judged corrupt or set aside
