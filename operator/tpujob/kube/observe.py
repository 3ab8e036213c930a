"""Read one job's world: the job, its pods, the nodes, its heartbeat, log tails.

Two sources answer the same reads (`ClusterReads`): the watch-fed `cache.CachedView` that the
running operator uses, and `Reader`, which asks the API directly (one-off tools, and the only
way to read a log tail). `observe` turns either into the planner's `Observed`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Protocol

from kubernetes import client

from tpujob.api import GROUP, PLURAL, VERSION, TPUTrainingJob, labels, parse_job
from tpujob.kube.cache import PodRecord, pod_by_pool, pod_record
from tpujob.kube.errors import KubeError, NotFoundError, call
from tpujob.observed.redact import redact
from tpujob.observed.views import (
    Heartbeat,
    NodeView,
    Observed,
    heartbeat_view,
    node_view,
    own_heartbeat,
)
from tpujob.plan import manifests

LOG_TAIL_LINES = 80
# A line may be long (a tensor printed whole): the tail kept is bounded in characters too, so
# a thousand failing hosts cost the operator a bounded memory, and the diagnosis reads no more.
LOG_TAIL_CHARS = 16 * 1024


class ClusterReads(Protocol):
    """What one reconcile reads; `in_memory` says whether reading blocks on the network."""

    @property
    def in_memory(self) -> bool: ...

    def job_body(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def pod_records(self, namespace: str, job: str) -> list[PodRecord]: ...

    def node_views(self) -> Mapping[str, NodeView]: ...

    def heartbeat(self, namespace: str, lease: str) -> Heartbeat | None: ...

    def busy_pools(self, namespace: str, job: str) -> frozenset[str]: ...

    def pool_holders(self, pool: str) -> frozenset[tuple[str, str]]: ...


class Reader:
    """Typed reads over one ApiClient, straight from the API."""

    in_memory = False

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)

    def raw(self, obj: Any) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(obj))

    def job_body(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(
                call(
                    self.custom.get_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    PLURAL,
                    name,
                )
            )
        except NotFoundError:
            return None

    def pod_records(self, namespace: str, job: str) -> list[PodRecord]:
        found = call(self.core.list_namespaced_pod, namespace, label_selector=f"{labels.JOB}={job}")
        return [pod_record(self.raw(p)) for p in found.items]

    def node_views(self) -> dict[str, NodeView]:
        views = (node_view(self.raw(n)) for n in call(self.core.list_node).items)
        return {view.name: view for view in views}

    def heartbeat(self, namespace: str, lease: str) -> Heartbeat | None:
        try:
            return heartbeat_view(
                self.raw(call(self.coordination.read_namespaced_lease, lease, namespace))
            )
        except NotFoundError:
            return None

    def _held(self) -> list[tuple[str, tuple[str, str]]]:
        found = call(self.core.list_pod_for_all_namespaces, label_selector=labels.JOB)
        return [
            (str(pool), key) for p in found.items for pool, key in pod_by_pool(self.raw(p)).items()
        ]

    def busy_pools(self, namespace: str, job: str) -> frozenset[str]:
        """Node pools holding live pods of other TPU jobs."""
        return frozenset(pool for pool, key in self._held() if key != (namespace, job))

    def pool_holders(self, pool: str) -> frozenset[tuple[str, str]]:
        return frozenset(key for held, key in self._held() if held == pool)

    def api_answers(self) -> None:
        """Raise UnavailableError unless the API server answers (its version: cheap)."""
        call(client.VersionApi(self.api).get_code)

    def config_data(self, namespace: str, name: str) -> dict[str, str]:
        """A ConfigMap's data; empty when there is none."""
        try:
            found = call(self.core.read_namespaced_config_map, name, namespace)
        except NotFoundError:
            return {}
        return {str(k): str(v) for k, v in (found.data or {}).items()}

    def log_tail(self, namespace: str, pod: str) -> str:
        """The pod's last lines, secrets redacted: they are copied into the job's status and
        Events, which more people can read than the pod's logs."""
        try:
            text = call(
                self.core.read_namespaced_pod_log, pod, namespace, tail_lines=LOG_TAIL_LINES
            )
        except KubeError:
            return ""  # logs are evidence, never a reason to fail a reconcile
        return redact(bounded_tail(str(text)))


def bounded_tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    """The last `limit` characters of `text`, from a line's start where one is in reach (a
    line cut in two could leave half a secret that `redact` no longer recognises); one line
    longer than the limit keeps its end, which says how it failed."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    start = tail.find("\n")
    return tail[start + 1 :] if start >= 0 else tail


def owned_by(obj: Mapping[str, Any], uid: str | None) -> bool:
    """Whether `obj` names the object with `uid` among its owners.

    Labels say which job a pod claims to belong to, and anyone who can create pods can set
    them; only the ownerReference the operator wrote ties a pod to this incarnation of the job
    (a job deleted and re-applied under the same name has a new uid).
    """
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)


def observe(
    reads: ClusterReads,
    body: Mapping[str, Any],
    parse: Callable[[Mapping[str, Any]], TPUTrainingJob] = parse_job,
) -> Observed:
    """Everything the planner needs for the job whose current body is `body`, but the log
    tails (`tails_to_read` says which; reading them is network I/O). `parse` turns the body
    into the typed job (the operator's reuses the last parse of an unchanged body)."""
    job = parse(body)
    uid = str((body.get("metadata") or {}).get("uid") or "")
    pods = tuple(
        sorted(
            (r.view for r in reads.pod_records(job.namespace, job.name) if uid and uid in r.owners),
            key=lambda p: p.name,
        )
    )
    return Observed(
        job=job,
        pods=pods,
        nodes=reads.node_views(),
        heartbeat=own_heartbeat(reads.heartbeat(job.namespace, manifests.lease_name(job)), uid),
        busy_pools=reads.busy_pools(job.namespace, job.name),
    )


def tails_to_read(observed: Observed) -> list[tuple[str, str]]:
    """(name, uid) of the pods whose tails matter: only the current attempt's failures are
    diagnosed."""
    attempt = observed.job.status.attempt
    return [(p.name, p.uid) for p in observed.pods if p.attempt == attempt and p.failed]


def with_tails(observed: Observed, tails: Iterable[tuple[str, str]]) -> Observed:
    return replace(observed, log_tails=dict(tails))
