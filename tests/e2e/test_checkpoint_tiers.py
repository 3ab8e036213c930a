"""Multi-tier checkpoints on the local cluster, with the real JAX trainer.

Each job saves to its pods' memory-backed local tier every 2 steps and to the persistent folder
every 10. A training process that died restarts in its own pod and the trainers restore from
their pods' local tiers (one whose write of it was cut short, from a peer's), a step newer than
any persistent one. A node lost in one slice of two
replaces that slice: the kept slice's trainers restore from their local tiers (one whose write
of the newest step was cut short gets it from a peer), the new pods' from a peer's broadcast of
the same step. A node lost under a one-slice job replaces every pod:
no local tier is left and the job restores from the persistent folder. Throughout, the steps the
job reports committed (the persistent tier's and worker 0's local tier's, on the heartbeat
Lease) never go back, and the step restored is at least the newest committed before the fault.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import FAULTED_STEPS, Run, assert_recovered, training_job
from tests.e2e.test_slice_restart import restarted_in_place

from tpujob.api import contract, labels
from tpujob.api.constants import LOCAL_CHECKPOINT_VOLUME
from tpujob.plan.manifests import heartbeat_lease_name

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]
LOCAL = {"intervalSteps": 2, "sizeLimit": "256Mi"}


def tiered_job(name: str, checkpoints: Path, **kwargs: Any) -> dict[str, Any]:
    body = training_job(name, checkpoints, **kwargs)
    body["spec"]["checkpoint"]["local"] = dict(LOCAL)
    return body


class Commits:
    """Samples the committed steps the heartbeat Lease reports while a job runs."""

    def __init__(self, cluster: LocalCluster, namespace: str, job: str) -> None:
        self._api = client.CoordinationV1Api(cluster.api_client())
        self._namespace, self._lease = namespace, heartbeat_lease_name(job)
        self.samples: list[tuple[int, int | None, int | None]] = []  # attempt, persistent, local
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Commits:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            try:
                lease = self._api.read_namespaced_lease(self._lease, self._namespace)
            except client.ApiException:
                continue
            notes: dict[str, str] = lease.metadata.annotations or {}
            attempt = _number(notes.get(contract.HEARTBEAT_ATTEMPT))
            if attempt is None:
                continue
            self.samples.append(
                (
                    attempt,
                    _number(notes.get(contract.HEARTBEAT_CHECKPOINT_STEP)),
                    _number(notes.get(contract.HEARTBEAT_LOCAL_CHECKPOINT_STEP)),
                )
            )

    def newest(self, attempt: int) -> int:
        """The newest step any tier was reported committed in `attempt`."""
        return max((max(p or -1, q or -1) for a, p, q in self.samples if a == attempt), default=-1)

    def assert_never_back(self, *, local: bool = True) -> None:
        """The tiers' reported steps never went back, across the attempts: the persistent
        tier's, and the local tier's where it outlived the failure (`local`)."""
        for column, tier in ((1, "persistent"), (2, "local"))[: 2 if local else 1]:
            seen = [v for v in (row[column] for row in self.samples) if v is not None]
            assert seen, f"no {tier} step was reported: {self.samples[-20:]}"
            assert seen == sorted(seen), f"the {tier} tier's step went back: {seen}"


def _number(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def restored(run: Run, pod: str) -> tuple[int, str]:
    """The step the pod's trainer restored last and the tier it read it from."""
    log = run.core.read_namespaced_pod_log(pod, run.namespace)
    found = re.findall(r"restored step (\d+) from the (\w+) tier", log)
    assert found, f"{pod} restored nothing:\n{log[-3000:]}"
    return int(found[-1][0]), found[-1][1]


@pytest.fixture
def commits(cluster: LocalCluster, namespace: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    started: list[Commits] = []

    def watch(job: str) -> Commits:
        started.append(Commits(cluster, namespace, job).__enter__())
        return started[-1]

    yield watch
    for item in started:
        item.__exit__()


def test_a_trainer_restarted_in_its_pod_restores_from_the_local_tier(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path, commits: Any
) -> None:
    body = tiered_job("tiers", tmp_path, steps=60, faults=("crash@28:worker=1:attempt=1",))
    run = Run(cluster, namespace, operator, body)
    watched = commits("tiers")
    run.wait_training(step=12)
    pods = {p.metadata.name: (p.metadata.uid, p.spec.node_name) for p in run.pods(1)}
    spec = next(iter(run.pods(1))).spec
    volume = next(v for v in spec.volumes if v.name == LOCAL_CHECKPOINT_VOLUME)
    assert (volume.empty_dir.medium, volume.empty_dir.size_limit) == ("Memory", "256Mi")
    status = run.wait_phase("Succeeded")
    assert_recovered(status, soft=1)
    restarted_in_place(run, pods)
    before = watched.newest(attempt=1)
    steps = {name: restored(run, name) for name in pods}
    step = steps["tiers-1-0-0"][0]
    assert {s for s, _ in steps.values()} == {step}, steps
    # Each reads its own local tier; a local write runs on a background thread, so the crashed
    # process may have died before its write of the newest step ended: then a peer serves it.
    sources = [source for _, source in steps.values()]
    assert "local" in sources and set(sources) <= {"local", "peer"}, steps
    # Saved locally every 2 steps, persistently every 10: the crash before step 28 left 26
    # in the local tiers, newer than the persistent tier's newest (20).
    assert step > 20
    assert step >= before  # nothing committed before the fault is lost
    assert status["currentAttempt"]["resumedStep"] >= step
    watched.assert_never_back()


@pytest.mark.long
def test_a_replaced_slice_restores_from_a_peer_and_the_kept_one_from_its_local_tier(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path, commits: Any
) -> None:
    run = Run(
        cluster, namespace, operator, tiered_job("peer", tmp_path, slices=2, steps=FAULTED_STEPS)
    )
    watched = commits("peer")
    run.wait_training(step=25)
    # A node lost: a SIGKILLed trainer container would restart in its pod, keeping every pod.
    cluster.tpujob("local", "fault", "node-down", run.node_of(1, 1, 0))
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    before = watched.newest(attempt=1)
    now = sorted(p.metadata.name for p in run.pods(2))
    assert now == ["peer-1-0-0", "peer-1-0-1", "peer-2-1-0", "peer-2-1-1"]
    steps = {name: restored(run, name) for name in now}
    step = steps["peer-1-0-0"][0]
    assert {s for s, _ in steps.values()} == {step}, steps
    # The new slice's pods start with empty local tiers: the step comes from a peer.
    assert (steps["peer-2-1-0"][1], steps["peer-2-1-1"][1]) == ("peer", "peer"), steps
    # The kept slice reads its own tiers. A local write runs on a background thread, so when
    # the slice's training processes are stopped one may have finished writing the newest step
    # and the other not: that one is served the step by a peer rather than restoring an older.
    kept = [steps["peer-1-0-0"][1], steps["peer-1-0-1"][1]]
    assert "local" in kept and set(kept) <= {"local", "peer"}, steps
    assert step >= before
    assert status["currentAttempt"]["resumedStep"] >= step
    watched.assert_never_back()


@pytest.mark.long
def test_a_lost_node_replaces_every_pod_and_the_job_restores_from_the_persistent_tier(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path, commits: Any
) -> None:
    run = Run(cluster, namespace, operator, tiered_job("durable", tmp_path, steps=FAULTED_STEPS))
    watched = commits("durable")
    before = run.wait_training(step=25)
    node = run.node_of(1, 0, 1)
    cluster.tpujob("local", "fault", "node-down", node)
    status = run.wait_phase("Succeeded")
    assert_recovered(status, hard=1)
    persistent = before.get("checkpointStep")
    assert persistent is not None
    pods = sorted(p.metadata.name for p in run.pods(2))
    assert pods == ["durable-2-0-0", "durable-2-0-1"]
    steps = {name: restored(run, name) for name in pods}
    step = steps[pods[0]][0]
    # The local tiers went with the pods: the newest step left is the persistent tier's.
    assert steps == {name: (step, "persistent") for name in pods}
    assert step >= persistent
    assert step >= max(p or -1 for a, p, _ in watched.samples if a == 1)
    assert status["currentAttempt"]["resumedStep"] >= step
    assert all(p.metadata.labels[labels.ATTEMPT] == "2" for p in run.pods(2))
    # The local tiers went with the pods, and the new pods' start empty again.
    watched.assert_never_back(local=False)
