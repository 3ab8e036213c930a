"""Queueing through Kueue on the local cluster: real Kueue, real trainers, real checkpoints.

Kueue runs beside the cluster (`tpujob.local.kueue`) with `TPUTrainingJob` as an external
framework, and an operator started with `--kueue` serves this module's namespaces. The
ClusterQueue's quota is one slice's chips, so one job runs at a time: jobs are admitted by
priority, a higher-priority job preempts a running one, which saves, requeues and resumes from
its checkpoint, and every job's quota is released when it ends. A job naming no queue runs as
it always did. With two slices' quota and two jobs of one priority running, the one that saved
last is the one preempted (the operator's priority boost, a point per 4 s of work at risk here).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.e2e.conftest import (
    LocalCluster,
    crd_names,
    create_namespace,
    delete_namespace,
    wait_established,
    wait_for,
)
from tests.e2e.operator_fixture import OPERATOR_ARGS, OperatorProcess
from tests.e2e.test_operator_recovery import Run, timeline_kinds, training_job

from tpujob.api import labels
from tpujob.local import kueue as local_kueue
from tpujob.observed.admission import PRIORITY_BOOST
from tpujob.plan.queueing import KUEUE_GROUP, KUEUE_VERSION, PRIORITY_CLASS_LABEL

pytestmark = [pytest.mark.cluster, pytest.mark.trainer, pytest.mark.long]

PREFIX = "queued"
CHIPS_PER_SLICE = 8  # two hosts of four chips: the test pools' slice
BOOST_SECONDS = 4  # a point of priority boost per this much work at risk (a minute by default)


def _args() -> tuple[str, ...]:
    args = list(OPERATOR_ARGS)
    args[args.index("--namespace") + 1] = f"{PREFIX}-*"
    args[args.index("--ledger-namespace") + 1] = f"{PREFIX}-operator-home"
    return (*args, "--kueue", "--preemption-boost-seconds", str(BOOST_SECONDS))


@pytest.fixture(scope="module")
def kueue(
    cluster: LocalCluster, crds_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[local_kueue.Kueue]:
    crds = local_kueue.crd_files()
    for crd in crds:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    wait_established(cluster, crd_names(crds[0].parent))
    work = tmp_path_factory.mktemp("kueue")
    running = local_kueue.start(work, cluster.kubeconfig, work / "ca", pods_ready_seconds=300)
    api = cluster.api_client()
    admission = client.AdmissionregistrationV1Api(api)
    for hook in running.webhooks:
        create = (
            admission.create_mutating_webhook_configuration
            if hook["kind"] == "MutatingWebhookConfiguration"
            else admission.create_validating_webhook_configuration
        )
        with contextlib.suppress(ApiException):
            create(hook)
    custom = client.CustomObjectsApi(api)
    for name, value in (("low", 100), ("high", 1000)):
        with contextlib.suppress(ApiException):
            custom.create_cluster_custom_object(
                KUEUE_GROUP,
                KUEUE_VERSION,
                "workloadpriorityclasses",
                {
                    "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                },
            )
    with contextlib.suppress(ApiException):
        custom.create_cluster_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            "resourceflavors",
            {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": "ResourceFlavor",
                "metadata": {"name": "tpu-v4-2x2x2"},
                "spec": {
                    "nodeLabels": {labels.ACCELERATOR: "tpu-v4-podslice", labels.TOPOLOGY: "2x2x2"}
                },
            },
        )
    try:
        yield running
    finally:
        running.stop()
        for hook in running.webhooks:
            delete = (
                admission.delete_mutating_webhook_configuration
                if hook["kind"] == "MutatingWebhookConfiguration"
                else admission.delete_validating_webhook_configuration
            )
            with contextlib.suppress(ApiException):
                delete(hook["metadata"]["name"])


@pytest.fixture(scope="module")
def queued_operator(
    cluster: LocalCluster, kueue: local_kueue.Kueue, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    core = client.CoreV1Api(cluster.api_client())
    with contextlib.suppress(ApiException):
        core.create_namespace({"metadata": {"name": f"{PREFIX}-operator-home"}})
    proc = OperatorProcess(
        cluster.kubeconfig, tmp_path_factory.mktemp("queued-operator") / "log", args=_args()
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


class Queue:
    """A namespace with a LocalQueue on a ClusterQueue of its own (`slices` slices' chips)."""

    def __init__(
        self,
        cluster: LocalCluster,
        *,
        preemption: bool,
        admission_check: str | None = None,
        slices: int = 1,
    ) -> None:
        self.cluster = cluster
        api = cluster.api_client()
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.check: str | None = None
        suffix = uuid.uuid4().hex[:5]
        self.namespace, self.cluster_queue = f"{PREFIX}-{suffix}", f"{PREFIX}-cq-{suffix}"
        create_namespace(self.core, self.namespace)
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.namespace}},
            "resourceGroups": [
                {
                    "coveredResources": [labels.TPU_RESOURCE],
                    "flavors": [
                        {
                            "name": "tpu-v4-2x2x2",
                            "resources": [
                                {
                                    "name": labels.TPU_RESOURCE,
                                    "nominalQuota": CHIPS_PER_SLICE * slices,
                                }
                            ],
                        }
                    ],
                }
            ],
        }
        if preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        if admission_check:
            spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": admission_check}]}
        self._create_cluster("clusterqueues", "ClusterQueue", self.cluster_queue, spec)
        self.custom.create_namespaced_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            self.namespace,
            "localqueues",
            {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": "LocalQueue",
                "metadata": {"name": "team-queue"},
                "spec": {"clusterQueue": self.cluster_queue},
            },
        )

    def _create_cluster(self, plural: str, kind: str, name: str, spec: dict[str, Any]) -> None:
        self.custom.create_cluster_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            plural,
            {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": kind,
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    def submit(
        self, operator: OperatorProcess, body: dict[str, Any], priority: str | None = None
    ) -> Run:
        body["metadata"]["labels"] = {labels.QUEUE_NAME: "team-queue"}
        if priority:
            body["metadata"]["labels"][PRIORITY_CLASS_LABEL] = priority
        return Run(self.cluster, self.namespace, operator, body)

    def usage(self) -> dict[str, Any]:
        """The ClusterQueue's admitted workloads and chips in use."""
        cq = self.custom.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", self.cluster_queue
        )
        status = cq.get("status") or {}
        used = [
            r.get("total")
            for f in status.get("flavorsUsage") or []
            for r in f.get("resources") or []
        ]
        return {"admitted": status.get("admittedWorkloads", 0), "used": used}

    def workloads(self) -> list[dict[str, Any]]:
        return list(
            self.custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, self.namespace, "workloads"
            )["items"]
        )

    def close(self) -> None:
        delete_namespace(self.core, self.namespace)
        wait_for(
            lambda: not _exists(self.core, self.namespace),
            timeout=120,
            what=f"namespace {self.namespace} gone",
        )
        with contextlib.suppress(ApiException):
            self.custom.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", self.cluster_queue
            )


def _exists(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespace(namespace)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


@pytest.fixture
def preempting_queue(cluster: LocalCluster, kueue: local_kueue.Kueue) -> Iterator[Queue]:
    queue = Queue(cluster, preemption=True)
    try:
        yield queue
    finally:
        queue.close()


@pytest.fixture
def two_slice_queue(cluster: LocalCluster, kueue: local_kueue.Kueue) -> Iterator[Queue]:
    queue = Queue(cluster, preemption=True, slices=2)
    try:
        yield queue
    finally:
        queue.close()


CHECK_CONTROLLER = "tpujob.dev/test-check"


@pytest.fixture
def checked_queue(cluster: LocalCluster, kueue: local_kueue.Kueue) -> Iterator[Queue]:
    """A queue whose ClusterQueue has an admission check this test module controls."""
    custom = client.CustomObjectsApi(cluster.api_client())
    name = f"{PREFIX}-check-{uuid.uuid4().hex[:5]}"
    custom.create_cluster_custom_object(
        KUEUE_GROUP,
        KUEUE_VERSION,
        "admissionchecks",
        {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "spec": {"controllerName": CHECK_CONTROLLER},
        },
    )
    # Kueue uses a check only once its controller says it is active.
    custom.patch_cluster_custom_object_status(
        KUEUE_GROUP,
        KUEUE_VERSION,
        "admissionchecks",
        name,
        {"status": {"conditions": [_condition("Active", "the test controls it")]}},
    )
    queue = Queue(cluster, preemption=False, admission_check=name)
    queue.check = name
    try:
        yield queue
    finally:
        queue.close()
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", name)


def _condition(kind: str, message: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True",
        "reason": kind,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


@pytest.fixture
def plain_queue(cluster: LocalCluster, kueue: local_kueue.Kueue) -> Iterator[Queue]:
    queue = Queue(cluster, preemption=False)
    try:
        yield queue
    finally:
        queue.close()


def _admitted(status: dict[str, Any]) -> bool:
    return bool((status.get("queue") or {}).get("admitted"))


def _no_usage(queue: Queue) -> bool:
    usage = queue.usage()
    return usage["admitted"] == 0 and all(str(u) in ("0", "None") for u in usage["used"])


def test_a_higher_priority_job_preempts_one_that_saves_requeues_and_resumes_from_its_checkpoint(
    preempting_queue: Queue, queued_operator: OperatorProcess, tmp_path: Path
) -> None:
    queue = preempting_queue
    low = queue.submit(
        queued_operator, training_job("low", tmp_path / "low", steps=260), priority="low"
    )
    queued = low.wait(lambda s: "Queued" in timeline_kinds(s), "the low job queued first")
    assert queued["phase"] in ("Suspended", "Starting", "Running")
    before = low.wait_training(step=25)
    assert before["queue"]["clusterQueue"] == queue.cluster_queue
    high = queue.submit(
        queued_operator, training_job("high", tmp_path / "high", steps=30), priority="high"
    )
    evicted = low.wait(
        lambda s: (s.get("queue") or {}).get("evictions") == 1, "the low job preempted"
    )
    assert "Preempted" in evicted["queue"]["lastEviction"]
    assert evicted["phase"] == "Suspended"
    done = high.wait_phase("Succeeded")
    assert "Admitted" in timeline_kinds(done)
    # The low job saved on SIGTERM, waited in the queue, and resumed from that save.
    finished = low.wait_phase("Succeeded")
    kinds = timeline_kinds(finished)
    assert kinds.count("Admitted") == 2 and "Evicted" in kinds
    assert finished["currentAttempt"]["resumedStep"] >= before["checkpointStep"]
    assert finished["goodputBreakdown"]["queued"] > 0
    assert not low.pods(attempt=1)
    wait_for(lambda: _no_usage(queue), timeout=60, what="the quota released")
    finished_workloads = [
        w
        for w in queue.workloads()
        if any(
            c["type"] == "Finished" and c["status"] == "True"
            for c in w["status"].get("conditions", [])
        )
    ]
    assert len(finished_workloads) == 2


def _boost_of(queue: Queue, job: str) -> int | None:
    for w in queue.workloads():
        if w["metadata"].get("labels", {}).get(labels.JOB) == job:
            value = (w["metadata"].get("annotations") or {}).get(PRIORITY_BOOST)
            return None if value is None else int(value)
    return None


def test_of_two_jobs_of_one_priority_the_one_that_saved_last_is_preempted(
    two_slice_queue: Queue, queued_operator: OperatorProcess, tmp_path: Path
) -> None:
    """`saved` commits a checkpoint every 2 steps; `unsaved` commits none, so a preemption
    would throw away all it did. `unsaved` is admitted after `saved`, so Kueue's own order
    among equals (the most recently admitted first) would preempt it: the operator's boost
    turns that round."""
    queue = two_slice_queue
    saved_body = training_job("saved", tmp_path / "saved", steps=3000, step_time=0.2)
    saved_body["spec"]["checkpoint"]["intervalSteps"] = 2
    saved = queue.submit(queued_operator, saved_body, priority="low")
    saved.wait_training(step=5)
    unsaved_body = training_job("unsaved", tmp_path / "unsaved", steps=3000, step_time=0.2)
    unsaved_body["spec"]["checkpoint"]["intervalSteps"] = 3000
    unsaved = queue.submit(queued_operator, unsaved_body, priority="low")
    unsaved.wait_training(step=5)
    # A commit lags its step by a moment, so `saved` may show a point or so of its own.
    wait_for(
        lambda: (
            (saved_boost := _boost_of(queue, "saved")) is not None
            and (_boost_of(queue, "unsaved") or 0) >= saved_boost + 2
        ),
        timeout=120,
        what="the unsaved job's boost two points above the saved one's",
    )
    high = queue.submit(
        queued_operator, training_job("high", tmp_path / "high", steps=10), priority="high"
    )
    evicted = saved.wait(
        lambda s: (s.get("queue") or {}).get("evictions") == 1, "the saved job preempted"
    )
    assert "Preempted" in evicted["queue"]["lastEviction"]
    high.wait(_admitted, "the high job admitted")
    still = unsaved.status()
    assert (still.get("queue") or {}).get("evictions", 0) == 0, still.get("queue")
    assert still["phase"] == "Running" and still["attempt"] == 1


def test_jobs_are_admitted_by_priority_and_a_job_naming_no_queue_is_untouched(
    plain_queue: Queue, queued_operator: OperatorProcess, tmp_path: Path
) -> None:
    queue = plain_queue
    first = queue.submit(queued_operator, training_job("first", tmp_path / "first", steps=80))
    first.wait(_admitted, "the first job admitted")
    low = queue.submit(
        queued_operator, training_job("low", tmp_path / "low", steps=20), priority="low"
    )
    high = queue.submit(
        queued_operator, training_job("high", tmp_path / "high", steps=20), priority="high"
    )
    waiting = low.wait(lambda s: s.get("phase") == "Suspended", "the low job held")
    assert waiting["conditions"] and any(
        c["type"] == "Suspended" and c["reason"] == "WaitingForAdmission"
        for c in waiting["conditions"]
    )
    assert not low.pods() and not high.pods()
    # The first job ends: its quota goes to the higher priority first, though it came later.
    high.wait(_admitted, "the high job admitted")
    assert not _admitted(low.status())
    high.wait_phase("Succeeded")
    low.wait_phase("Succeeded")
    first.wait_phase("Succeeded")
    # A job naming no queue, in the same namespace: no Workload, no queue status, it runs.
    alone = Run(
        queue.cluster,
        queue.namespace,
        queued_operator,
        training_job("alone", tmp_path / "alone", steps=20),
    )
    status = alone.wait_phase("Succeeded")
    assert "queue" not in status
    names = [w["metadata"]["labels"].get(labels.JOB) for w in queue.workloads()]
    assert "alone" not in names
    wait_for(lambda: _no_usage(queue), timeout=60, what="the quota released")


PROVISIONED = "autoscaling.x-k8s.io/consume-provisioning-request"


def test_an_admission_checks_pod_set_updates_reach_the_pods_of_its_slice(
    checked_queue: Queue, queued_operator: OperatorProcess, tmp_path: Path
) -> None:
    """The test is the check's controller, as a ProvisioningRequest's would be: once Kueue has
    reserved quota it lets the job through with annotations, a label and a toleration for its
    pods; Kueue admits, and the pods the operator makes carry them."""
    queue = checked_queue
    run = queue.submit(queued_operator, training_job("checked", tmp_path / "ckpt", steps=20))

    def pending_check() -> dict[str, Any] | None:
        for wl in queue.workloads():
            checks = (wl.get("status") or {}).get("admissionChecks") or []
            if any(c.get("name") == queue.check and c.get("state") == "Pending" for c in checks):
                return wl
        return None

    wl = wait_for(pending_check, timeout=120, what="quota reserved, the check pending")
    assert not run.pods()  # not admitted yet
    update = {
        "name": "slice-0",
        "annotations": {PROVISIONED: "checked-prov"},
        "labels": {"capacity": "provisioned", labels.JOB: "not-this-job"},
        "tolerations": [
            {"key": "example.com/provisioned", "operator": "Exists", "effect": "NoSchedule"}
        ],
    }
    check = {
        "name": queue.check,
        "state": "Ready",
        "message": "capacity provisioned",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "podSetUpdates": [update],
    }
    queue.custom.patch_namespaced_custom_object_status(
        KUEUE_GROUP,
        KUEUE_VERSION,
        queue.namespace,
        "workloads",
        wl["metadata"]["name"],
        {"status": {"admissionChecks": [check]}},
    )
    run.wait(_admitted, "the job admitted once its check passed")
    pods = wait_for(lambda: run.pods() or None, timeout=120, what="the job's pods")
    for pod in pods:
        assert (pod.metadata.annotations or {}).get(PROVISIONED) == "checked-prov"
        assert pod.metadata.labels["capacity"] == "provisioned"
        assert pod.metadata.labels[labels.JOB] == run.name  # the operator's own label stays
        assert any(t.key == "example.com/provisioned" for t in pod.spec.tolerations or [])
    run.wait_phase("Succeeded")
