"""Recovery drills: transient faults stay transient, and nothing from elsewhere is trusted.

Each drill runs real multi-process JAX trainers on the local cluster and makes a real fault
happen at a chosen moment: a worker SIGKILLed again and again (once while the next attempt is
still restoring), a namespace quota too small for the job, a node whose Ready flaps, a job
deleted and re-applied while its old pods linger, kube-apiserver stopped while jobs train, a
node whose kubelet goes silent while its trainer keeps training. The drills run under an
operator of their own, in namespaces of their own (`drill-*`), so its flags (a short
node-not-ready grace) are theirs alone; the silent-kubelet drill needs single-host slices and
gets a second local cluster with such pools.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.e2e.conftest import (
    ROOT,
    LocalCluster,
    crd_names,
    create_namespace,
    delete_namespace,
    wait_established,
    wait_for,
)
from tests.e2e.operator_fixture import OPERATOR_ARGS, OperatorProcess
from tests.e2e.test_operator_recovery import Run, timeline_kinds, training_job

from tpujob.api import GROUP, PLURAL, VERSION, labels
from tpujob.api.contract import ExitCode
from tpujob.local import controlplane, faults
from tpujob.local.binaries import binary_dir

pytestmark = [pytest.mark.cluster, pytest.mark.trainer]

# A node whose Ready is not True for this long is lost; shorter than the default so a drill can
# show both sides of it, longer than the flap the drill makes.
NOT_READY_GRACE = 20
DRILL_ARGS = (
    *(a if a != "test-*" else "drill-*" for a in OPERATOR_ARGS),
    "--node-not-ready-grace",
    str(NOT_READY_GRACE),
    "--cache-check-seconds",
    "5",
)


@pytest.fixture(scope="module")
def drill_operator(
    cluster: LocalCluster, crds_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        cluster.kubeconfig, tmp_path_factory.mktemp("drill-operator") / "log", args=DRILL_ARGS
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _new_namespace(core: client.CoreV1Api, base: str) -> str:
    return create_namespace(core, f"drill-{base}-{uuid.uuid4().hex[:5]}")


@pytest.fixture
def drill_namespace(core: client.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    base = request.node.name.removeprefix("test_").replace("_", "-")[:30].strip("-")
    name = _new_namespace(core, base)
    yield name
    delete_namespace(core, name)


def finished(run: Run, timeout: float = 300) -> dict[str, Any]:
    """The status once the job ended either way (a drill that fails should fail fast)."""
    return run.wait(
        lambda s: s.get("phase") in ("Succeeded", "Failed"), "the job finished", timeout
    )


def restarts(status: dict[str, Any]) -> tuple[int, int, int]:
    counts = status.get("restarts") or {}
    return counts.get("soft", 0), counts.get("medium", 0), counts.get("hard", 0)


@pytest.mark.long
def test_worker_killed_three_times_once_while_restoring_is_three_soft_restarts(
    cluster: LocalCluster, drill_namespace: str, drill_operator: OperatorProcess, tmp_path: Path
) -> None:
    # Attempt 1 dies at step 50. Attempt 2 dies before its first step, right after restoring,
    # whichever checkpoint it restored (hence a crash at every checkpoint + 1): before its first
    # heartbeat, while status.progress still holds attempt 1's step. Attempt 3 trains on and
    # dies at step 75. Each is one worker SIGKILLed: transient, so three soft restarts.
    on_restore = tuple(f"crash@{step}:worker=1:attempt=2" for step in range(1, 52, 10))
    run = Run(
        cluster,
        drill_namespace,
        drill_operator,
        training_job(
            "thrice",
            tmp_path,
            steps=100,
            faults=("crash@50:worker=1:attempt=1", *on_restore, "crash@75:worker=1:attempt=3"),
        ),
    )
    status = finished(run, timeout=420)
    context = (
        f"phase {status['phase']}; history {status.get('failureHistory')}; "
        f"timeline {status.get('timeline')}"
    )
    assert status["phase"] == "Succeeded", context
    assert restarts(status) == (3, 0, 0), context
    assert status["restarts"]["total"] == 3, context
    assert status["attempt"] == 4, context
    history = status["failureHistory"]
    assert [h["attempt"] for h in history] == [1, 2, 3], context
    assert {h["class"] for h in history} == {"soft"}, context
    # Attempt 2 never reported a step of its own: its failure carries none, and it did not
    # count as progress; the two failures that did train carry different steps.
    assert history[1].get("step") is None and not history[1].get("progressed"), context
    assert history[0]["step"] != history[2]["step"], context
    restarting = [e["message"] for e in status["timeline"] if e["kind"] == "Restarting"]
    assert len(restarting) == 3 and all(m.startswith("[SOFT]") for m in restarting), context
    resumed = [e["message"] for e in status["timeline"] if e["kind"] == "Resumed"]
    assert not any(m.startswith("attempt 2 ") for m in resumed), context
    assert status["progress"]["step"] == 100


# Soft recoveries while the operator is SIGKILLed every 3-12 s (each kill lands at a random
# moment of whatever it is doing). `make test` runs three (about two and a half minutes); a
# longer drill is one variable away: TPUJOB_CRASH_DRILL_RECOVERIES=20 make crash-drill.
RECOVERIES = int(os.environ.get("TPUJOB_CRASH_DRILL_RECOVERIES", "3"))


def _live_pods(run: Run) -> list[Any]:
    return [
        p
        for p in run.pods()
        if p.metadata.deletion_timestamp is None and p.status.phase in ("Pending", "Running")
    ]


@pytest.mark.long
def test_operator_killed_at_random_moments_of_soft_recoveries_repeats_and_loses_nothing(
    cluster: LocalCluster, drill_namespace: str, drill_operator: OperatorProcess, tmp_path: Path
) -> None:
    # Attempt A SIGKILLs worker 1 at step 10A+5, past the checkpoint it resumed from (10A-10
    # or earlier), so each attempt trains a little and fails at a step of its own: six
    # transient failures, each a soft restart. Meanwhile the operator is SIGKILLed every few
    # seconds, whatever it is doing (writing the status, deleting pods, creating them, telling
    # Events), and started again.
    crashes = tuple(f"crash@{10 * a + 5}:worker=1:attempt={a}" for a in range(1, RECOVERIES + 1))
    steps = 10 * RECOVERIES + 20
    run = Run(
        cluster,
        drill_namespace,
        drill_operator,
        training_job(
            "killed", tmp_path, steps=steps, faults=crashes, maxSoftRestarts=RECOVERIES + 5
        ),
    )
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    uids: dict[str, set[str]] = {}
    overlaps: list[str] = []
    kills = 0
    next_kill = time.monotonic() + rng.uniform(2, 10)
    deadline = time.monotonic() + 600 + 120 * RECOVERIES
    status: dict[str, Any] = {}
    try:
        while time.monotonic() < deadline:
            live = _live_pods(run)
            for pod in run.pods():
                uids.setdefault(pod.metadata.name, set()).add(pod.metadata.uid)
            # A pod's name holds the attempt that created it; its attempt label moves on when
            # the pod is kept for the next attempt, one pod after the other (an operator
            # killed between two of those patches finishes them when it is back). Pods made
            # for two attempts alive together are what must never be.
            made_for = {p.metadata.name.rsplit("-", 3)[1] for p in live}
            if len(live) > 2 or len(made_for) > 1:
                overlaps.append(", ".join(sorted(p.metadata.name for p in live)))
            status = run.status()
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            if time.monotonic() >= next_kill:
                drill_operator.kill()
                kills += 1
                time.sleep(rng.uniform(0, 1.5))
                drill_operator.start()
                next_kill = time.monotonic() + rng.uniform(3, 12)
            time.sleep(0.5)
    finally:
        if drill_operator.proc is None or drill_operator.proc.poll() is not None:
            drill_operator.start()
    context = (
        f"seed {seed}, {kills} operator kills; phase {status.get('phase')}; "
        f"restarts {status.get('restarts')}; last failure {status.get('lastFailure')}"
    )
    assert status.get("phase") == "Succeeded", context
    assert kills >= RECOVERIES, context  # the drill did kill it throughout
    assert restarts(status) == (RECOVERIES, 0, 0), context
    assert status["attempt"] == RECOVERIES + 1, context
    history = status["failureHistory"]
    assert [h["attempt"] for h in history] == list(range(1, RECOVERIES + 1)), context
    assert overlaps == [], context  # never two attempts' pods, never a third worker
    assert {n: len(u) for n, u in uids.items() if len(u) > 1} == {}, context  # never re-created
    told = [
        e
        for e in run.core.list_namespaced_event(drill_namespace).items
        if e.involved_object.name == run.name and e.reason == "Restarting"
    ]
    assert len(told) == RECOVERIES, [e.message for e in told]
    assert status["progress"]["step"] == steps
    # Every rejoin the crashes interrupted was finished: the last pods carry the last attempt.
    newest = max(int(p.metadata.name.rsplit("-", 3)[1]) for p in run.pods())
    last = [p for p in run.pods() if int(p.metadata.name.rsplit("-", 3)[1]) == newest]
    assert {p.metadata.labels[labels.ATTEMPT] for p in last} == {str(RECOVERIES + 1)}, context


def test_quota_too_small_is_shown_and_the_job_launches_once_it_is_raised(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    drill_namespace: str,
    drill_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    # Each host of the slice needs 4 chips; the namespace may request 2 in all.
    quota = "tpu-quota"
    core.create_namespaced_resource_quota(
        drill_namespace,
        {"metadata": {"name": quota}, "spec": {"hard": {"requests.google.com/tpu": "2"}}},
    )
    wait_for(
        lambda: (
            (core.read_namespaced_resource_quota(quota, drill_namespace).status.hard or {}).get(
                "requests.google.com/tpu"
            )
            == "2"
        ),
        timeout=30,
        what="the quota admitted and counted",
    )
    run = Run(cluster, drill_namespace, drill_operator, training_job("quota", tmp_path, steps=30))

    def refused(status: dict[str, Any]) -> bool:
        condition = next(
            (c for c in status.get("conditions") or [] if c["type"] == "PodsRefused"), None
        )
        return condition is not None and condition["status"] == "True"

    # The first reconcile that tries to create the pods says why they do not exist; a loose
    # bound (the first reconcile comes within a second or two of the create on an idle machine).
    status = run.wait(refused, "the PodsRefused condition", timeout=60)
    condition = next(c for c in status["conditions"] if c["type"] == "PodsRefused")
    assert quota in condition["message"], condition
    assert "exceeded quota" in condition["message"], condition
    assert not run.pods()
    run.told(lambda m: quota in m)
    core.patch_namespaced_resource_quota(
        quota, drill_namespace, {"spec": {"hard": {"requests.google.com/tpu": "8"}}}
    )
    run.wait_training(step=5)
    status = run.wait_phase("Succeeded")
    assert status["restarts"]["total"] == 0
    condition = next(c for c in status["conditions"] if c["type"] == "PodsRefused")
    assert condition["status"] == "False", condition


@pytest.mark.usefixtures("healthy_nodes")
def test_node_ready_flapping_within_the_grace_is_no_failure(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    drill_namespace: str,
    drill_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    run = Run(cluster, drill_namespace, drill_operator, training_job("flap", tmp_path, steps=100))
    run.wait_training(step=15)
    node = run.node_of(1, 0, 1)

    def ready_is(value: str) -> bool:
        conditions = core.read_node(node).status.conditions or []
        return any(c.type == "Ready" and c.status == value for c in conditions)

    # A kubelet's hiccup: Ready=False for a couple of seconds, then True again. Every node
    # change wakes the job, so the operator sees it; the node-lifecycle controller's not-ready
    # taint evicts only after its toleration (5 s here), so the flap stays shorter than that.
    faults.set_node_fault(cluster.state_dir, node, not_ready=True)
    try:
        wait_for(lambda: ready_is("False"), timeout=15, what=f"{node} Ready=False", interval=0.1)
        time.sleep(1.5)
    finally:
        faults.set_node_fault(cluster.state_dir, node, not_ready=False)
    wait_for(lambda: ready_is("True"), timeout=15, what=f"{node} Ready=True again", interval=0.1)
    status = finished(run)
    context = f"last failure {status.get('lastFailure')}; timeline {status.get('timeline')}"
    assert status["phase"] == "Succeeded", context
    assert status["attempt"] == 1, context
    assert status["restarts"]["total"] == 0, context
    assert status["failedNodes"] == [], context
    assert labels.BAD_NODE_TAINT not in {t.key for t in core.read_node(node).spec.taints or []}


def test_job_reapplied_while_old_pods_linger_trains_from_scratch_on_its_own_pods(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    drill_namespace: str,
    drill_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    hold = "drills.tpujob.dev/hold"
    first = Run(
        cluster,
        drill_namespace,
        drill_operator,
        training_job("again", tmp_path / "first", steps=20),
    )
    first.wait_phase("Succeeded")
    old_pods = first.pods()
    assert len(old_pods) == 2
    # The old incarnation's finished pods linger after its deletion (a finalizer holds them,
    # as a slow kubelet or a controller of someone else's would): same names, same labels,
    # phase Succeeded. Adopting them by label would "succeed" without training.
    for pod in old_pods:
        core.patch_namespaced_pod(
            pod.metadata.name, drill_namespace, {"metadata": {"finalizers": [hold]}}
        )
    try:
        first.custom.delete_namespaced_custom_object(
            GROUP, VERSION, drill_namespace, PLURAL, "again"
        )
        wait_for(lambda: _job_gone(first), timeout=60, what="the first job deleted")
        wait_for(
            lambda: all(p.metadata.deletion_timestamp for p in first.pods()),
            timeout=60,
            what="the old pods garbage-collected (held Terminating)",
        )
        second = Run(
            cluster,
            drill_namespace,
            drill_operator,
            training_job("again", tmp_path / "second", steps=30),
        )
        uid = second.custom.get_namespaced_custom_object(
            GROUP, VERSION, drill_namespace, PLURAL, "again"
        )["metadata"]["uid"]
        second.wait(
            lambda s: s.get("attempt") == 1 and "PodsCreated" in timeline_kinds(s),
            "the new job's first attempt launched",
            timeout=60,
        )
        time.sleep(5)  # several reconciles with the old pods in view
        status = second.status()
        assert status.get("phase") != "Succeeded", status
        assert not (status.get("progress") or {}).get("step"), status
    finally:
        for pod in old_pods:
            try:
                core.patch_namespaced_pod(
                    pod.metadata.name, drill_namespace, {"metadata": {"finalizers": None}}
                )
            except ApiException as err:
                if err.status != 404:
                    raise
    status = second.wait_phase("Succeeded")
    assert status["progress"]["step"] == 30
    assert status["restarts"]["total"] == 0
    assert status["currentAttempt"]["resumedStep"] < 10  # from scratch: no checkpoint before 10
    pods = second.pods()
    assert len(pods) == 2
    assert all(p.metadata.uid not in {o.metadata.uid for o in old_pods} for p in pods)
    assert all(any(r.uid == uid for r in p.metadata.owner_references or []) for p in pods)
    log = core.read_namespaced_pod_log("again-1-0-0", drill_namespace)
    assert "resumed from step" not in log


def test_job_reapplied_after_an_orphaning_delete_says_why_it_waits_then_trains_on_its_own_pods(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    drill_namespace: str,
    drill_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    first = Run(
        cluster,
        drill_namespace,
        drill_operator,
        training_job("orphan", tmp_path / "first", steps=200),
    )
    first.wait_training(step=5)
    # `kubectl delete --cascade=orphan`: the job goes, its pods and Lease stay and train on.
    first.custom.delete_namespaced_custom_object(
        GROUP,
        VERSION,
        drill_namespace,
        PLURAL,
        "orphan",
        body=client.V1DeleteOptions(propagation_policy="Orphan"),
    )
    wait_for(lambda: _job_gone(first), timeout=60, what="the first job deleted")
    second = Run(
        cluster,
        drill_namespace,
        drill_operator,
        training_job("orphan", tmp_path / "second", steps=30),
    )
    uid = second.custom.get_namespaced_custom_object(
        GROUP, VERSION, drill_namespace, PLURAL, "orphan"
    )["metadata"]["uid"]
    # The orphans hold the names the new job needs: it says so instead of waiting in silence,
    # and never counts them as its own.
    status = second.wait(
        lambda s: any(
            c["type"] == "PodsRefused"
            and c["status"] == "True"
            and "not this job's" in c.get("message", "")
            for c in s.get("conditions", [])
        ),
        "PodsRefused naming the orphans",
        timeout=60,
    )
    assert status.get("phase") != "Succeeded"
    orphans = [
        p for p in second.pods() if not any(r.uid == uid for r in p.metadata.owner_references or [])
    ]
    assert orphans
    # Taking the Lease over, the new job wrote its token (attempt 1) and its uid: the orphans,
    # attempt 1 of the earlier job, would have read that token as their own and saved on. They
    # are fenced at their next save instead, and stop without saving.
    orphan_uids = {o.metadata.uid for o in orphans}

    def exit_codes() -> list[int | None]:
        codes = []
        for pod in second.pods():
            if pod.metadata.uid in orphan_uids:
                state = (pod.status.container_statuses or [None])[0]
                ended = state.state.terminated if state is not None else None
                codes.append(ended.exit_code if ended is not None else None)
        return codes

    wait_for(
        lambda: exit_codes() == [int(ExitCode.FENCED)] * len(orphans),
        timeout=60,
        what="the orphans fenced (exit 43)",
    )
    for orphan in orphans:
        # By uid: the job creates its own pod under that name as soon as the orphan is gone.
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(
                orphan.metadata.name,
                drill_namespace,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=orphan.metadata.uid),
                ),
            )

    def own_pods_run(_: dict[str, Any]) -> bool:
        pods = [
            p for p in second.pods() if any(r.uid == uid for r in p.metadata.owner_references or [])
        ]
        return len(pods) == 2 and all(p.status.phase in ("Running", "Succeeded") for p in pods)

    second.wait(own_pods_run, "the new job's own pods running", timeout=120)
    status = finished(second)
    assert status["phase"] == "Succeeded", status
    assert status["restarts"]["total"] == 0, (
        status.get("timeline"),
        status.get("lastFailure"),
        status.get("failureHistory"),
    )
    log = core.read_namespaced_pod_log("orphan-1-0-0", drill_namespace)
    assert "resumed from step" not in log  # its own, empty checkpoint directory: from scratch


def _job_gone(run: Run) -> bool:
    try:
        run.custom.get_namespaced_custom_object(GROUP, VERSION, run.namespace, PLURAL, run.name)
    except ApiException as err:
        return err.status == 404
    return False


@pytest.mark.usefixtures("healthy_nodes")
@pytest.mark.long
def test_apiserver_outage_leaves_training_jobs_untouched(
    cluster: LocalCluster, core: client.CoreV1Api, drill_operator: OperatorProcess, tmp_path: Path
) -> None:
    namespaces = [_new_namespace(core, f"outage-{i}") for i in range(2)]
    try:
        runs = [
            Run(
                cluster,
                ns,
                drill_operator,
                training_job(f"outage{i}", tmp_path / str(i), steps=450, stallTimeoutSeconds=20),
            )
            for i, ns in enumerate(namespaces)
        ]
        for run in runs:
            run.wait_training(step=10)
        before = {run.name: run.status()["progress"]["step"] for run in runs}
        stopped = controlplane.stop_component(cluster.state_dir, "kube-apiserver")
        try:
            time.sleep(30)
        finally:
            controlplane.start_component(cluster.state_dir, stopped)
        back = time.monotonic()
        # Reconciles resume: each job's status shows progress beyond what it showed before
        # the outage. The issue asks for "within seconds"; the bound is loose because two
        # trainers, the operator and a restarting control plane share a small machine.
        for run in runs:
            run.wait(
                lambda s, r=run: (s.get("progress") or {}).get("step", 0) > before[r.name],
                "progress reported again after the outage",
                timeout=30,
            )
        resumed_after = time.monotonic() - back
        for run in runs:
            status = finished(run)
            context = (
                f"phase {status['phase']}; resumed {resumed_after:.0f}s after the "
                f"apiserver; last failure {status.get('lastFailure')}; "
                f"timeline {status.get('timeline')}"
            )
            assert status["phase"] == "Succeeded", context
            assert status["attempt"] == 1, context
            assert status["restarts"]["total"] == 0, context
            assert [p.metadata.labels[labels.ATTEMPT] for p in run.pods()] == ["1", "1"]
    finally:
        for ns in namespaces:
            delete_namespace(core, ns)


# A slice of one host: its trainer trains alone, so with its kubelet cut off it trains on.
SINGLE_HOST_POOLS = controlplane.PoolOptions(
    pools=2, accelerator="tpu-v4-podslice", topology="2x2x1", spare_nodes=1
)
LOG_TIME = "%Y-%m-%d %H:%M:%S,%f"


@pytest.fixture(scope="module")
def single_host_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A second local cluster whose TPU pools are single-host slices (the session's are not)."""
    state_dir = tmp_path_factory.mktemp("single-host-cluster")
    state = controlplane.up(state_dir, SINGLE_HOST_POOLS, out=sys.stderr)
    try:
        cluster = LocalCluster(state_dir, state_dir / "kubeconfig", binary_dir(), state.server)
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        wait_established(cluster, crd_names(ROOT / "crds"))
        yield cluster
    finally:
        controlplane.down(state_dir)


def saves(log: str) -> list[tuple[datetime.datetime, int]]:
    """(when, step) of every save a trainer's log says it started."""
    found = re.findall(r"^(\S+ \S+) INFO \S+: saving step (\d+) ", log, flags=re.MULTILINE)
    return [(datetime.datetime.strptime(when, LOG_TIME), int(step)) for when, step in found]


def test_node_cut_off_while_its_trainer_trains_on_cannot_touch_the_new_attempts_checkpoints(
    single_host_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    cluster = single_host_cluster
    operator = OperatorProcess(
        cluster.kubeconfig, tmp_path_factory.mktemp("single-host-operator") / "log", args=DRILL_ARGS
    )
    operator.start()
    core = client.CoreV1Api(cluster.api_client())
    namespace = _new_namespace(core, "zombie")
    node = ""
    try:
        body = training_job("zombie", tmp_path, steps=260)
        body["spec"]["tpu"]["topology"] = "2x2x1"
        run = Run(cluster, namespace, operator, body)
        run.wait_training(step=20)
        node = run.node_of(1, 0, 0)
        # The kubelet goes silent; the trainer does not notice and trains and saves on. The
        # node-lifecycle controller gives up on the node, the operator starts attempt 2 on
        # the other pool and force-deletes the old pod, which its silent kubelet never kills.
        cut_at = run.status()["progress"]["step"]
        faults.set_node_fault(cluster.state_dir, node, kubelet_stopped=True)
        status = finished(run)
        context = (
            f"phase {status['phase']}; last failure {status.get('lastFailure')}; "
            f"timeline {status.get('timeline')}"
        )
        assert status["phase"] == "Succeeded", context
        assert restarts(status) == (0, 0, 1), context
        assert [n["name"] for n in status["failedNodes"]] == [node], context
        old_log = cluster.tpujob("local", "logs", "zombie-1-0-0", "-n", namespace).stdout
        new_log = core.read_namespaced_pod_log("zombie-2-0-0", namespace)
    finally:
        if node:
            faults.set_node_fault(cluster.state_dir, node, kubelet_stopped=False)
        delete_namespace(core, namespace)
        operator.stop()
    old_saves, new_saves = saves(old_log), saves(new_log)
    restored = re.search(r"resumed from step (\d+)", new_log)
    assert restored is not None, new_log[-2000:]
    assert old_saves and new_saves
    # The old attempt really went on as a zombie: it saved after the step at which its node was
    # cut off... and stopped at its first save once the operator had fenced it.
    assert max(s for _, s in old_saves) > cut_at + 10, (cut_at, old_saves)
    assert "fenc" in old_log.lower(), old_log[-2000:]
    first_new = new_saves[0][0]
    late = [(str(t), s) for t, s in old_saves if t >= first_new]
    assert not late, f"old attempt saved after the new attempt's first save: {late}"
    # Training resumed from a committed step, and the steps left in the directory are the
    # new attempt's own saves.
    assert int(restored.group(1)) >= max(s for _, s in old_saves) - 10
    kept = {int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()}
    assert kept and kept <= {s for _, s in new_saves}, (kept, new_saves)


@pytest.mark.long
def test_pods_deleted_while_the_operators_watch_was_down_are_dropped_and_the_job_goes_on(
    cluster: LocalCluster, drill_namespace: str, drill_operator: OperatorProcess, tmp_path: Path
) -> None:
    """A watch that breaks while objects go (here: the operator frozen while the apiserver
    restarts, then its pods deleted) resumes with a list that no longer shows them, and no
    DELETED event ever comes: a cache that kept them would keep them for good, and the job
    would wait forever for pods that are not there. The operator's pod informer, told that its
    version is gone, lists again and drops what the listing no longer shows (the ghost check,
    DRILL_ARGS: every few seconds, would find any left after two lists); the job's pods are
    made again."""
    run = Run(
        cluster,
        drill_namespace,
        drill_operator,
        training_job("ghosts", tmp_path, steps=400, stallTimeoutSeconds=20),
    )
    run.wait_training(step=10)
    pods = run.pods(1)
    assert drill_operator.proc is not None
    os.killpg(drill_operator.proc.pid, signal.SIGSTOP)
    try:
        stopped = controlplane.stop_component(cluster.state_dir, "kube-apiserver")
        controlplane.start_component(cluster.state_dir, stopped)
        for pod in pods:
            with contextlib.suppress(ApiException):
                run.core.delete_namespaced_pod(
                    pod.metadata.name,
                    drill_namespace,
                    body=client.V1DeleteOptions(grace_period_seconds=0),
                )
        wait_for(lambda: not run.pods(1), timeout=60, what="attempt 1's pods gone")
        # Seen once: kube-scheduler, too, missed these deletions across the restart ("Scheduler
        # cache is corrupted"), and no later pod on this shared cluster was scheduled. The
        # drill is about the operator's cache; a fresh scheduler lists the cluster again.
        scheduler = controlplane.stop_component(cluster.state_dir, "kube-scheduler")
        controlplane.start_component(cluster.state_dir, scheduler)
    finally:
        os.killpg(drill_operator.proc.pid, signal.SIGCONT)
    status = finished(run, timeout=420)
    context = f"timeline {status.get('timeline')}; operator log:\n{drill_operator.log_tail(30)}"
    assert status["phase"] == "Succeeded", context
    assert status["progress"]["step"] == 400, context
    # Trained to the end by pods made after the ghosts were dropped (the operator makes the
    # missing pods of an attempt again; a hang would have restarted it instead).
    finishers = {p.metadata.uid for p in run.pods()}
    assert finishers and finishers.isdisjoint(p.metadata.uid for p in pods), context
    log = drill_operator.log_path.read_text(errors="replace")
    dropped = r"watch of pods: dropped \d+ the cluster|dropped \d+ pods? the cluster no longer has"
    assert re.search(dropped, log), context
