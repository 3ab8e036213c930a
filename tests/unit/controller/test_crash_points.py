"""An operator killed at every effect point of a hard recovery finishes it exactly once.

A small simulated cluster keeps what the API would (the job and its resourceVersion, pods,
node taints, Events by name); the operator's writer applies to it and dies (an exception no
handler catches, as SIGKILL leaves nothing to catch) at the k-th effect. A new operator process
(fresh `Deps`: no memory of the dead one) then reconciles until the recovery is done. For every
k: no duplicate or extra pod, the budgets exact, the blamed node tainted once, each Event told
once.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from functools import partial
from typing import Any

import pytest
from tests.unit.builders import at, cluster, job_body, pod, running_status
from tests.unit.fakes import FakeReader, deps_for

from tpujob.api import labels
from tpujob.controller.reconcile import reconcile
from tpujob.kube.apply import event_name
from tpujob.kube.errors import ConflictError
from tpujob.plan.result import EventSpec, NodeMark, PodDeletion

LOST = "pool-0-w1"


class Killed(BaseException):
    """The operator process died here (not an Exception: nothing may handle it)."""


class SimCluster:
    """What the API server would hold, changed only through the operator's writer."""

    def __init__(self) -> None:
        job = job_body(status=running_status())
        self.body = job
        self.pods = {p["metadata"]["name"]: p for p in (pod(job, 1, 0, 0), pod(job, 1, 0, 1))}
        self.nodes = cluster(3, **{LOST: {"ready": "Unknown"}})
        self.events: Counter[str] = Counter()  # name -> creations that found no such name
        self.told: list[tuple[str, str]] = []
        self.taints_added: Counter[str] = Counter()
        self.fence = 0

    def reader(self) -> FakeReader:
        return FakeReader(
            list(self.pods.values()), body=copy.deepcopy(self.body), nodes=copy.deepcopy(self.nodes)
        )


class SimWriter:
    """The operator's writer against `SimCluster`; dies at effect number `die_at`."""

    def __init__(self, sim: SimCluster, die_at: int | None, counter: list[int]) -> None:
        self.sim, self.die_at, self.counter = sim, die_at, counter

    def _effect(self) -> None:
        self.counter[0] += 1
        if self.die_at is not None and self.counter[0] == self.die_at:
            raise Killed

    def write_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self._effect()
        current = self.sim.body["metadata"]["resourceVersion"]
        if body["metadata"]["resourceVersion"] != current:
            raise ConflictError(409, "Conflict", "changed")
        meta = {**self.sim.body["metadata"], "resourceVersion": str(int(current) + 1)}
        self.sim.body = {**self.sim.body, "metadata": meta, "status": copy.deepcopy(status)}
        return copy.deepcopy(self.sim.body)

    def fence(self, lease: dict[str, Any], attempt: int) -> None:
        self._effect()
        self.sim.fence = max(self.sim.fence, attempt)

    def create(self, obj: dict[str, Any]) -> bool:
        self._effect()
        name = obj["metadata"]["name"]
        if obj["kind"] != "Pod" or name in self.sim.pods:
            return obj["kind"] == "Pod" and False
        created = copy.deepcopy(obj)
        created["metadata"]["uid"] = f"uid-{name}"
        created["status"] = {"phase": "Pending"}
        self.sim.pods[name] = created
        return True

    def pod_owner_uids(self, namespace: str, name: str) -> frozenset[str]:
        found = self.sim.pods.get(name, {})
        return frozenset(r["uid"] for r in found.get("metadata", {}).get("ownerReferences", []))

    def delete_pod(self, namespace: str, deletion: PodDeletion) -> None:
        self._effect()
        found = self.sim.pods.get(deletion.name)
        if found is not None and found["metadata"]["uid"] == deletion.uid:
            del self.sim.pods[deletion.name]

    def mark_node(self, mark: NodeMark, job: str) -> None:
        self._effect()
        node = next(n for n in self.sim.nodes if n["metadata"]["name"] == mark.node)
        taints = node["spec"]["taints"]
        if not any(t["key"] == labels.BAD_NODE_TAINT for t in taints):
            taints.append({"key": labels.BAD_NODE_TAINT, "value": job, "effect": "NoSchedule"})
            self.sim.taints_added[mark.node] += 1

    def event(self, body: dict[str, Any], spec: EventSpec) -> bool:
        self._effect()
        name = event_name(body["metadata"], spec)
        new = name not in self.sim.events
        if new:
            self.sim.told.append((spec.reason, spec.message))
        self.sim.events[name] += 1
        return new

    def save_config(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self._effect()

    def bind_cluster_role(self, *args: str) -> None:
        self._effect()


def recover(die_at: int | None) -> tuple[SimCluster, int]:
    """Run reconciles (a new process after each death) until attempt 2 is launched and its
    journal is empty; returns the cluster and how many effects were made in all."""
    sim, counter = SimCluster(), [0]
    died = False
    for step in range(12):
        deps = deps_for(sim.reader(), SimWriter(sim, None if died else die_at, counter))
        deps.clock = partial(at, 20 + step)
        try:
            asyncio.run(reconcile(deps, "team", "train"))
        except Killed:
            died = True
        status = sim.body["status"]
        attempt_two = [p for p in sim.pods if p.startswith("train-2-")]
        if status.get("attempt") == 2 and len(attempt_two) == 2 and not status.get("pendingEvents"):
            return sim, counter[0]
    raise AssertionError(f"recovery did not finish; status {sim.body['status']}")


def effects_of_an_undisturbed_recovery() -> int:
    return recover(None)[1]


@pytest.mark.parametrize("die_at", range(1, effects_of_an_undisturbed_recovery() + 1))
def test_an_operator_killed_at_any_effect_finishes_the_recovery_exactly_once(die_at: int) -> None:
    sim, _ = recover(die_at)
    status = sim.body["status"]
    assert sorted(sim.pods) == ["train-2-0-0", "train-2-0-1"]  # no duplicate, no extra
    assert status["restarts"] == {"soft": 0, "medium": 0, "hard": 1, "total": 1}
    assert [n["name"] for n in status["failedNodes"]] == [LOST]
    assert status["failedNodeBudgetLeft"] == 0
    assert sim.taints_added == Counter({LOST: 1})
    assert sim.fence == 2
    reasons = Counter(reason for reason, _ in sim.told)
    assert all(count == 1 for count in reasons.values()), sim.told
    assert reasons["FailureDiagnosed"] == 1
