"""The shell of the Kueue integration: the watch-fed records of Workloads and ResourceFlavors,
and the writes to a job's Workload that a plan asks for (`tpujob.plan.result.WorkloadWrite`).

Only Workloads labelled with a job's name are watched, and of those only the one owned by the
job's uid under the name the operator gives it is read (`workload_for`): a Workload anyone in
the namespace created cannot stand in for a job's. A status write carries the resourceVersion
the plan read, so it never overwrites a decision Kueue made meanwhile (a Conflict redoes the
reconcile on fresh data).
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from tpujob.api import labels
from tpujob.kube.errors import ConflictError, NotFoundError, call
from tpujob.observed.admission import (
    PRIORITY_BOOST,
    WORK_SINCE_CHECKPOINT,
    WorkloadView,
    flavor_node_labels,
    parse_workload,
    ready_checks,
)
from tpujob.plan.queueing import KUEUE_GROUP, KUEUE_VERSION, POD_PRIORITY_CLASS
from tpujob.plan.result import WorkloadPriority, WorkloadWrite

Index = Mapping[Hashable, Iterable[Any]]
WORKLOADS = "workloads"
FLAVORS = "resourceflavors"


@dataclass(frozen=True)
class WorkloadRecord:
    """A Workload labelled with a job's name: who owns it, and the parts the operator reads."""

    name: str
    owners: frozenset[str]
    raw: Mapping[str, Any]


def workload_record(raw: Mapping[str, Any]) -> dict[Hashable, WorkloadRecord]:
    meta = raw.get("metadata") or {}
    job = (meta.get("labels") or {}).get(labels.JOB)
    namespace = meta.get("namespace")
    if not job or not namespace:
        return {}
    refs = meta.get("ownerReferences") or []
    owners = frozenset(str(r.get("uid")) for r in refs if isinstance(r, Mapping) and r.get("uid"))
    status = raw.get("status") or {}
    kept = {
        "metadata": {
            **{k: meta.get(k) for k in ("name", "uid", "resourceVersion")},
            "annotations": {
                k: v
                for k, v in (meta.get("annotations") or {}).items()
                if k in (PRIORITY_BOOST, WORK_SINCE_CHECKPOINT)
            },
        },
        "spec": {k: (raw.get("spec") or {}).get(k) for k in ("active", "queueName")},
        "status": {
            **{k: status.get(k) for k in ("conditions", "admission")},
            "admissionChecks": ready_checks(status),
        },
    }
    return {(str(namespace), str(job)): WorkloadRecord(str(meta.get("name")), owners, kept)}


def flavor_record(raw: Mapping[str, Any]) -> dict[Hashable, dict[str, str]]:
    name = (raw.get("metadata") or {}).get("name")
    return {str(name): flavor_node_labels(raw)} if name else {}


def workload_for(
    workloads: Index, flavors: Index, job: tuple[str, str], *, uid: str, name: str
) -> WorkloadView | None:
    """The job's own Workload, parsed with its flavors' node labels; None when it has none."""
    found = next(
        (
            r
            for r in workloads.get(job, ())
            if isinstance(r, WorkloadRecord) and r.name == name and uid and uid in r.owners
        ),
        None,
    )
    if found is None:
        return None

    def labels_of(flavor: str) -> Mapping[str, str]:
        found: Mapping[str, str] = next(iter(flavors.get(flavor, ())), {})
        return found

    # Only the flavors Kueue assigned are looked up: a reconcile pays for those, not for
    # every flavor of the cluster.
    return parse_workload(found.raw, labels_of)


class WorkloadWriter:
    """Carries out a plan's `WorkloadWrite`."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.scheduling = client.SchedulingV1Api(api)

    def write(self, namespace: str, write: WorkloadWrite) -> None:
        if write.create is not None:
            self._create(namespace, write.create, write.priority)
            return
        patch: dict[str, Any] = {}
        if write.active is not None:
            patch["spec"] = {"active": write.active}
        if write.annotations is not None:
            patch["metadata"] = {"annotations": dict(write.annotations)}
        if patch:
            call(
                self.custom.patch_namespaced_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                namespace,
                WORKLOADS,
                write.name,
                patch,
            )
        if write.conditions is None and not write.clear_admission:
            return
        status: dict[str, Any] = {}
        if write.conditions is not None:
            status["conditions"] = list(write.conditions)
        if write.clear_admission:
            status["admission"] = None
        call(
            self.custom.patch_namespaced_custom_object_status,
            KUEUE_GROUP,
            KUEUE_VERSION,
            namespace,
            WORKLOADS,
            write.name,
            {"metadata": {"resourceVersion": write.resource_version}, "status": status},
        )

    def _create(
        self, namespace: str, body: dict[str, Any], priority: WorkloadPriority | None
    ) -> None:
        if priority is not None:
            value = self._priority_value(priority)
            if value is not None:
                body = {
                    **body,
                    "spec": {
                        **body["spec"],
                        "priorityClassRef": {
                            "group": priority.group,
                            "kind": priority.kind,
                            "name": priority.name,
                        },
                        "priority": value,
                    },
                }
        # Conflict: made by an earlier reconcile, and the watch shows it soon.
        with contextlib.suppress(ConflictError):
            call(
                self.custom.create_namespaced_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                namespace,
                WORKLOADS,
                body,
            )

    def _priority_value(self, priority: WorkloadPriority) -> int | None:
        """The class's value; None (the Workload gets no priority) when it does not exist."""
        try:
            if priority.kind == POD_PRIORITY_CLASS:
                found = call(self.scheduling.read_priority_class, priority.name)
                return int(found.value)
            raw = call(
                self.custom.get_cluster_custom_object,
                KUEUE_GROUP,
                KUEUE_VERSION,
                "workloadpriorityclasses",
                priority.name,
            )
            return int((raw or {}).get("value") or 0)
        except NotFoundError:
            return None
