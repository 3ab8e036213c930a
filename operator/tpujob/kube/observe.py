"""Read one job's world: the job, its pods, the nodes, its heartbeat Lease, log tails."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client

from tpujob import labels, manifests
from tpujob.api import GROUP, PLURAL, VERSION, TPUTrainingJob, parse_job
from tpujob.kube.errors import KubeError, NotFoundError, call
from tpujob.observed import Observed, heartbeat_view, node_view, pod_view
from tpujob.redact import redact

LOG_TAIL_LINES = 80


class Reader:
    """Typed reads over one ApiClient."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)

    def raw(self, obj: Any) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(obj))

    def job_body(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(call(self.custom.get_namespaced_custom_object, GROUP, VERSION,
                             namespace, PLURAL, name))
        except NotFoundError:
            return None

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        found = call(self.core.list_namespaced_pod, namespace,
                     label_selector=f"{labels.JOB}={job}")
        return [self.raw(p) for p in found.items]

    def nodes(self) -> list[dict[str, Any]]:
        return [self.raw(n) for n in call(self.core.list_node).items]

    def busy_pools(self, namespace: str, job: str) -> frozenset[str]:
        """Node pools holding live pods of other TPU jobs."""
        found = call(self.core.list_pod_for_all_namespaces, label_selector=labels.JOB)
        busy = set()
        for pod in found.items:
            meta = pod.metadata
            if (meta.namespace, (meta.labels or {}).get(labels.JOB)) == (namespace, job):
                continue
            if pod.status.phase in ("Succeeded", "Failed"):
                continue
            pool = (pod.spec.node_selector or {}).get(labels.NODEPOOL)
            if pool:
                busy.add(pool)
        return frozenset(busy)

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.raw(call(self.coordination.read_namespaced_lease, name, namespace))
        except NotFoundError:
            return None

    def log_tail(self, namespace: str, pod: str) -> str:
        """The pod's last lines, secrets redacted: they are copied into the job's status and
        Events, which more people can read than the pod's logs."""
        try:
            return redact(str(call(self.core.read_namespaced_pod_log, pod, namespace,
                                   tail_lines=LOG_TAIL_LINES)))
        except KubeError:
            return ""  # logs are evidence, never a reason to fail a reconcile


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether `obj` names the object with `uid` among its owners.

    Labels say which job a pod claims to belong to, and anyone who can create pods can set
    them; only the ownerReference the operator wrote ties a pod to this incarnation of the job
    (a job deleted and re-applied under the same name has a new uid).
    """
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)


def observe(reader: Reader, body: Mapping[str, Any]) -> Observed:
    """Everything the planner needs for the job whose current body is `body`."""
    job: TPUTrainingJob = parse_job(body)
    uid = (body.get("metadata") or {}).get("uid")
    raw_pods = [p for p in reader.pods(job.namespace, job.name) if owned_by(p, uid)]
    # Termination messages end up in the status and Events too (FallbackToLogsOnError).
    pods = tuple(replace(view, message=redact(view.message))
                 for view in (pod_view(p) for p in raw_pods))
    tails = {}
    for pod in pods:
        # Only the current attempt's failures are diagnosed; fetch each tail once, here.
        if pod.attempt == job.status.attempt and pod.failed:
            tails[pod.name] = reader.log_tail(job.namespace, pod.name)
    return Observed(
        job=job, pods=pods,
        nodes={n["metadata"]["name"]: node_view(n) for n in reader.nodes()},
        heartbeat=heartbeat_view(reader.lease(job.namespace, manifests.lease_name(job))),
        busy_pools=reader.busy_pools(job.namespace, job.name),
        log_tails=tails)
