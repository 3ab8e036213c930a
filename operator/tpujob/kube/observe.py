"""Read one job's world: the job, its pods, the nodes, its heartbeat, log tails.

`observe` turns the watch-fed `cache.CachedView` into the planner's `Observed`; the cache is
the only source of those reads, in the operator and in its tests alike. `Reader` asks the API
for what no watch keeps: a log tail, a ConfigMap, whether the API answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client

from tpujob.api import Provisioning, TPUTrainingJob, parse_job
from tpujob.diagnosis.cascade import MAX_DIAGNOSED_WORKERS, sample_key
from tpujob.kube import uids
from tpujob.kube.cache import CachedView
from tpujob.kube.errors import KubeError, NotFoundError, call
from tpujob.kube.workloads import workload_for
from tpujob.observed.redact import redact
from tpujob.observed.views import NodeView, Observed, PodView, own_heartbeat, with_reports
from tpujob.plan import manifests, queueing
from tpujob.plan.placement import pools_of

LOG_TAIL_LINES = 80
# A line may be long (a tensor printed whole): the tail kept is bounded in characters too, so
# a thousand failing hosts cost the operator a bounded memory, and the diagnosis reads no more.
LOG_TAIL_CHARS = 16 * 1024


class Reader:
    """What the watch-fed cache cannot answer, asked of the API over one ApiClient: whether
    it answers at all, a ConfigMap's data, a pod's log tail, which objects exist now."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)

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

    def uids(self, kind: str, namespaces: tuple[str, ...]) -> frozenset[str]:
        """The uids of the `kind` ("pods", "nodes", "jobs") that exist, in `namespaces` or in
        all (`tpujob.kube.uids`): what the cache is checked against for ghosts."""
        if kind == "nodes":
            return uids.node_uids(self.api)
        if kind == "jobs":
            return uids.job_uids(self.api, namespaces)
        return uids.pod_uids(self.api, namespaces)

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
    cache: CachedView,
    body: Mapping[str, Any],
    parse: Callable[[Mapping[str, Any]], TPUTrainingJob] = parse_job,
) -> Observed:
    """Everything the planner needs for the job whose current body is `body`, from `cache`
    (in the event loop, where kopf changes it), but the log tails (`tails_to_read` says
    which; reading them is network I/O). `parse` turns the body into the typed job (the
    operator's reuses the last parse of an unchanged body)."""
    job = parse(body)
    uid = str((body.get("metadata") or {}).get("uid") or "")
    nodes = cache.node_views()
    owned = sorted(
        (r.view for r in cache.pod_records(job.namespace, job.name) if uid and uid in r.owners),
        key=lambda p: p.name,
    )
    pods = tuple(p for p in owned if not p.spare and made_as_placed(job, p, nodes))
    beat = own_heartbeat(cache.heartbeat(job.namespace, manifests.lease_name(job)), uid)
    workloads = cache.workloads
    workload = (
        workload_for(
            workloads,
            cache.flavors or {},
            (job.namespace, job.name),
            uid=uid,
            name=queueing.workload_name(job),
        )
        if workloads is not None
        else None
    )
    return Observed(
        job=job,
        pods=with_reports(pods, beat, job.status.attempt, uid),
        spares=tuple(p for p in owned if p.spare),
        nodes=nodes,
        heartbeat=beat,
        busy_pools=cache.busy_pools(job.namespace, job.name),
        queueing=workloads is not None,
        workload=workload,
    )


def made_as_placed(job: TPUTrainingJob, pod: PodView, nodes: Mapping[str, NodeView]) -> bool:
    """Whether `pod` could be one the operator made: named as it names its pods and, in the
    current attempt, asking for the pool the job's status placed its slice on and bound to a
    node of that pool.

    Owner references and labels are written by whoever creates a pod. A pod forged with the
    job's uid and `nodeName` set to any node (the control plane's, another tenant's) bypasses
    the scheduler, and its failure, read as the job's, would be evidence against that node.
    The operator never sets `nodeName`: its pods land where the scheduler put them, on the
    pool it placed their slice on. (A forged pod on a node of the job's own pool blames only
    what the job holds.)
    """
    prefix, suffix = f"{job.name}-", f"-{pod.slice}-{pod.worker}"
    made = pod.name.removeprefix(prefix).removesuffix(suffix)  # the attempt that named it
    if not (pod.name.startswith(prefix) and pod.name.endswith(suffix) and made.isdigit()):
        return False
    if pod.attempt != job.status.attempt:
        return True
    placed = pools_of(job.status.current_attempt).get(pod.slice)
    node = nodes.get(pod.node) if pod.node else None
    # An Autoscale slice's pods name no pool: the scheduler chose one by their gang affinity.
    unpinned = job.spec.tpu.provisioning is Provisioning.AUTOSCALE and pod.node_pool is None
    if placed is None:  # the placement is recorded before any pod of it is made
        # ... but for an Autoscale slice until its first pod lands: then only a node of the
        # job's shape in some pool can be where the scheduler put it.
        tpu = job.spec.tpu
        return (
            unpinned
            and job.status.current_attempt.launched_time is not None
            and (
                node is None
                or (
                    bool(node.pool)
                    and node.accelerator == tpu.accelerator
                    and node.topology == tpu.topology
                )
            )
        )
    return (pod.node_pool == placed or unpinned) and (node is None or node.pool == placed)


def tails_to_read(observed: Observed) -> list[tuple[str, str]]:
    """(name, key) of the pods whose tails matter: only the current attempt's failures are
    diagnosed, and of a failure of more than `MAX_DIAGNOSED_WORKERS`, the earliest. The key
    names the log that was read: a failed pod's uid (its log no longer changes), or for a pod
    whose process ended and was reported, its uid and attempt (the pod's log goes on if the
    process is restarted in it, and a later failure needs a later tail)."""
    attempt = observed.job.status.attempt
    failed = [
        p for p in observed.pods if p.attempt == attempt and (p.failed or p.reported is not None)
    ]
    if len(failed) > MAX_DIAGNOSED_WORKERS:  # the diagnosis reads the earliest ones only
        failed = sorted(failed, key=lambda p: (sample_key(p.finished_at), p.name))
        failed = failed[:MAX_DIAGNOSED_WORKERS]
    return [(p.name, p.uid if p.failed else f"{p.uid}@{attempt}") for p in failed]


def with_tails(observed: Observed, tails: Iterable[tuple[str, str]]) -> Observed:
    return replace(observed, log_tails=dict(tails))
