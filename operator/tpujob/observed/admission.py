"""A job's Kueue Workload as the operator reads it: admitted or not, evicted why, finished.

Pure: parsing only. Kueue decides, on the Workload, whether a job that names a queue may run:
`status.admission` with the conditions QuotaReserved and Admitted say it may; Evicted says it
must stop (preempted, a PodsReady timeout, deactivated, its ClusterQueue stopped). The operator
reads those, and the node labels of the ResourceFlavors Kueue assigned, which the placement of
the job's slices must honour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tpujob.observed.views import parse_time

# Kueue's condition types and reasons on a Workload (kueue.x-k8s.io/v1beta2).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
PODS_READY = "PodsReady"
REQUEUED = "Requeued"
# Evictions after which Kueue requeues the workload at once (the job's fault is not the cause).
REQUEUED_AT_ONCE = frozenset({"Preempted", "NodeFailures"})
# Kueue's priority boost (feature gate PriorityBoost, alpha): added to the Workload's priority
# when Kueue orders preemption candidates and admissions.
PRIORITY_BOOST = "kueue.x-k8s.io/priority-boost"
# The work a preemption would throw away, as the operator last published it.
WORK_SINCE_CHECKPOINT = "tpujob.dev/work-since-checkpoint-seconds"
# Bounds on what is copied from an object anyone who may create Workloads could write.
MAX_LABELS = 32
MAX_TEXT = 256
MAX_TOLERATIONS = 8
# An admission check's state once its controller let the workload through.
CHECK_READY = "Ready"
TOLERATION_FIELDS = ("key", "operator", "value", "effect")


@dataclass(frozen=True)
class PodSetUpdate:
    """What an admission check asks of a pod set's pods (Kueue's `podSetUpdates`): a
    ProvisioningRequest's check names the capacity they are to consume, for one."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    def __or__(self, other: PodSetUpdate) -> PodSetUpdate:
        """Both checks' updates (the earlier check's value where two name one key)."""
        return PodSetUpdate(
            labels={**other.labels, **self.labels},
            annotations={**other.annotations, **self.annotations},
            node_selector={**other.node_selector, **self.node_selector},
            tolerations=(self.tolerations + other.tolerations)[:MAX_TOLERATIONS],
        )


@dataclass(frozen=True)
class WorkloadCondition:
    type: str
    status: str
    reason: str
    message: str
    last_transition_time: datetime | None

    @property
    def true(self) -> bool:
        return self.status == "True"

    def as_dict(self) -> dict[str, Any]:
        """The condition as the API writes it (`metav1.Condition`)."""
        when = self.last_transition_time
        return {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else None,
        }


@dataclass(frozen=True)
class WorkloadView:
    """The job's Workload: what Kueue decided about it."""

    name: str
    uid: str
    resource_version: str
    active: bool
    conditions: tuple[WorkloadCondition, ...] = ()
    cluster_queue: str | None = None
    # Pod set name -> the ResourceFlavor assigned to each of its resources.
    flavors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Node labels of the assigned flavors, all pod sets together (the shell resolves them).
    node_labels: Mapping[str, str] = field(default_factory=dict)
    # The priority boost on it (its annotation), None when it has none.
    boost: int | None = None
    # The LocalQueue it waits or was admitted in (spec.queueName).
    queue_name: str | None = None
    # Pod set name -> what the admission checks that passed ask of its pods.
    pod_set_updates: Mapping[str, PodSetUpdate] = field(default_factory=dict)

    def condition(self, kind: str) -> WorkloadCondition | None:
        return next((c for c in self.conditions if c.type == kind), None)

    def _true(self, kind: str) -> bool:
        found = self.condition(kind)
        return found is not None and found.true

    @property
    def quota_reserved(self) -> bool:
        return self._true(QUOTA_RESERVED) and self.cluster_queue is not None

    @property
    def admitted(self) -> bool:
        """Kueue lets the job run: quota reserved and every admission check passed."""
        return self.quota_reserved and self._true(ADMITTED)

    @property
    def evicted(self) -> WorkloadCondition | None:
        found = self.condition(EVICTED)
        return found if found is not None and found.true else None

    @property
    def finished(self) -> bool:
        return self._true(FINISHED)


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _conditions(raw: Any) -> tuple[WorkloadCondition, ...]:
    if not isinstance(raw, list):
        return ()
    found = []
    for item in raw[:16]:
        if isinstance(item, Mapping) and isinstance(item.get("type"), str):
            found.append(
                WorkloadCondition(
                    type=_text(item["type"]),
                    status=_text(item.get("status")),
                    reason=_text(item.get("reason")),
                    message=_text(item.get("message")),
                    last_transition_time=parse_time(item.get("lastTransitionTime")),
                )
            )
    return tuple(found)


def _flavors(admission: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    assigned: dict[str, tuple[str, ...]] = {}
    for item in (admission.get("podSetAssignments") or [])[:16]:
        if not isinstance(item, Mapping):
            continue
        flavors = item.get("flavors") if isinstance(item.get("flavors"), Mapping) else {}
        names = sorted({_text(v) for v in (flavors or {}).values() if isinstance(v, str)})
        assigned[_text(item.get("name"))] = tuple(names)
    return assigned


def _strings(raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {
        _text(k): _text(v)
        for k, v in list(raw.items())[:MAX_LABELS]
        if isinstance(k, str) and isinstance(v, str)
    }


def _toleration(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        return None
    found: dict[str, Any] = {k: _text(raw[k]) for k in TOLERATION_FIELDS if raw.get(k)}
    seconds = raw.get("tolerationSeconds")
    if isinstance(seconds, int) and not isinstance(seconds, bool):
        found["tolerationSeconds"] = seconds
    return found or None


def _pod_set_updates(status: Mapping[str, Any]) -> dict[str, PodSetUpdate]:
    """The updates of the admission checks in state Ready, by pod set, in the checks' order."""
    updates: dict[str, PodSetUpdate] = {}
    checks = status.get("admissionChecks")
    for check in checks[:16] if isinstance(checks, list) else ():
        if not isinstance(check, Mapping) or check.get("state") != CHECK_READY:
            continue
        items = check.get("podSetUpdates")
        for item in items[:16] if isinstance(items, list) else ():
            if not isinstance(item, Mapping) or not _text(item.get("name")):
                continue
            raw = item.get("tolerations")
            tolerations = tuple(
                t
                for t in map(_toleration, raw[:MAX_TOLERATIONS] if isinstance(raw, list) else ())
                if t is not None
            )
            update = PodSetUpdate(
                labels=_strings(item.get("labels")),
                annotations=_strings(item.get("annotations")),
                node_selector=_strings(item.get("nodeSelector")),
                tolerations=tolerations,
            )
            name = _text(item["name"])
            updates[name] = updates[name] | update if name in updates else update
    return updates


def ready_checks(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Ready admission checks' pod set updates as one bounded check, in the API's form:
    what a watch-fed record keeps of `status.admissionChecks` (parsed again, it gives the
    same updates)."""
    updates = _pod_set_updates(status)
    if not updates:
        return []
    items = [
        {
            "name": name,
            "labels": dict(update.labels),
            "annotations": dict(update.annotations),
            "nodeSelector": dict(update.node_selector),
            "tolerations": [dict(t) for t in update.tolerations],
        }
        for name, update in updates.items()
    ]
    return [{"name": "ready", "state": CHECK_READY, "podSetUpdates": items}]


def parse_workload(
    raw: Mapping[str, Any], flavor_labels: Callable[[str], Mapping[str, str]] | None = None
) -> WorkloadView:
    """`raw` Workload; `flavor_labels` gives an assigned ResourceFlavor's `spec.nodeLabels`
    (only the assigned ones are looked up)."""
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    status = raw.get("status") or {}
    admission = status.get("admission") if isinstance(status.get("admission"), Mapping) else None
    flavors = _flavors(admission) if admission is not None else {}
    labels: dict[str, str] = {}
    for names in flavors.values():
        for name in names:
            found = flavor_labels(name) if flavor_labels is not None else {}
            for key, value in found.items():
                if len(labels) < MAX_LABELS:
                    labels[key] = value
    cluster_queue = admission.get("clusterQueue") if admission is not None else None
    boost = _text((meta.get("annotations") or {}).get(PRIORITY_BOOST))
    return WorkloadView(
        name=_text(meta.get("name")),
        uid=_text(meta.get("uid")),
        resource_version=_text(meta.get("resourceVersion")),
        active=spec.get("active") is not False,
        conditions=_conditions(status.get("conditions")),
        cluster_queue=_text(cluster_queue) or None,
        flavors=flavors,
        node_labels=labels,
        boost=int(boost) if boost.lstrip("-").isdigit() else None,
        queue_name=_text(spec.get("queueName")) or None,
        pod_set_updates=_pod_set_updates(status),
    )


def flavor_node_labels(raw: Mapping[str, Any]) -> dict[str, str]:
    """A ResourceFlavor's `spec.nodeLabels`, bounded."""
    return _strings((raw.get("spec") or {}).get("nodeLabels"))
