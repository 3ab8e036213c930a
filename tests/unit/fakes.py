"""Fakes of the operator's own adapter (the cache, Reader, Writer) that record what the shell
does, and `deps_for`, which hands them to a reconcile the way the running operator has them."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from tests.unit.builders import cluster

from tpujob.controller.deps import Deps
from tpujob.kube.cache import (
    CachedView,
    NodeBook,
    job_record,
    lease_record,
    node_record,
    pod_by_job,
    pod_by_pool,
)
from tpujob.kube.errors import KubeError, UnavailableError
from tpujob.plan.result import EventSpec, NodeMark, PodDeletion, PodRejoin


class FakeReader(CachedView):
    """The reads a reconcile makes, over fixed objects, through the cache's own record
    functions (so what the indexes keep is what these tests plan on)."""

    def __init__(
        self,
        pods: list[dict[str, Any]],
        body: dict[str, Any] | None = None,
        lease: dict[str, Any] | None = None,
        nodes: list[dict[str, Any]] | None = None,
        logs: dict[str, str] | None = None,
    ) -> None:
        book = NodeBook()
        super().__init__(
            jobs=index([job_record(body)] if body is not None else []),
            pods=index(pod_by_job(p) for p in pods),
            pools=index(pod_by_pool(p) for p in pods),
            nodes=index(node_record(n, book) for n in (nodes if nodes is not None else cluster())),
            heartbeats=index([lease_record(lease)] if lease is not None else []),
            node_book=book,
        )
        object.__setattr__(self, "configs", {})
        object.__setattr__(self, "api_unreachable", False)
        object.__setattr__(self, "logs", logs or {})

    def replace_body(self, body: dict[str, Any]) -> None:
        """The job as the next watch event shows it: a newer resourceVersion than the one it
        replaces, as every change gets from the apiserver."""
        before = self.job_body(body["metadata"]["namespace"], body["metadata"]["name"])
        if before is not None:
            version = str(before["metadata"].get("resourceVersion", "0"))
            body = {**body, "metadata": {**body["metadata"]}}
            body["metadata"]["resourceVersion"] = (
                str(int(version) + 1) if version.isdigit() else version
            )
        self.jobs.clear()  # type: ignore[attr-defined]
        self.jobs.update(index([job_record(body)]))  # type: ignore[attr-defined]

    def log_tail(self, namespace: str, pod: str) -> str:
        logs: dict[str, str] = self.logs  # type: ignore[attr-defined]
        return logs.get(pod, "")

    def api_answers(self) -> None:
        if self.api_unreachable:  # type: ignore[attr-defined]
            raise UnavailableError(0, "ConnectionRefused", "apiserver down")

    def config_data(self, namespace: str, name: str) -> dict[str, str]:
        return dict(self.configs.get((namespace, name), {}))


def deps_for(reader: FakeReader, writer: Any = None, **fields: Any) -> Deps:
    """Deps as the operator has them once started: `reader` is the watch-fed cache (with its
    node book, which the node handler reads) and also answers what only the API can (log
    tails, ConfigMaps, whether the API answers)."""
    return Deps(
        reader=reader,  # type: ignore[arg-type]
        writer=writer if writer is not None else RecordingWriter(),
        view=reader,
        node_book=reader.node_book,
        **fields,
    )


def index(records: Iterable[Mapping[Hashable, Any]]) -> dict[Hashable, list[Any]]:
    """What a kopf index holds after listing these objects: key -> values."""
    found: dict[Hashable, list[Any]] = {}
    for record in records:
        for key, value in record.items():
            found.setdefault(key, []).append(value)
    return found


class RecordingWriter:
    """Records every effect in order; `fail` maps an effect name to the error it raises."""

    def __init__(self, fail: dict[str, KubeError] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail or {}
        self.statuses: list[dict[str, Any]] = []
        self.configs: dict[tuple[str, str], dict[str, str]] = {}
        # Pods that exist already, by name -> their owner uids (a create of one finds it).
        self.existing_pods: dict[str, frozenset[str]] = {}
        # Return the written body with the next resourceVersion, as the apiserver does.
        self.bump_version = False

    def _record(self, what: str, detail: str) -> None:
        self.calls.append((what, detail))
        if what in self.fail:
            raise self.fail[what]

    def write_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self._record("status", str(status.get("phase")))
        self.statuses.append(status)
        meta = dict(body["metadata"])
        if self.bump_version:
            meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1)
        return {**body, "metadata": meta, "status": status}

    def fence(self, lease: dict[str, Any], attempt: int) -> None:
        self._record("fence", str(attempt))

    def create(self, obj: dict[str, Any]) -> bool:
        self._record("create", f"{obj['kind']}/{obj['metadata']['name']}")
        if obj["kind"] == "Pod" and "create-pod" in self.fail:
            raise self.fail["create-pod"]
        return obj["metadata"]["name"] not in self.existing_pods

    def pod_owner_uids(self, namespace: str, name: str) -> frozenset[str]:
        return self.existing_pods.get(name, frozenset())

    def delete_pod(self, namespace: str, deletion: PodDeletion) -> None:
        self._record("delete", deletion.name)

    def rejoin_pod(self, namespace: str, rejoin: PodRejoin) -> None:
        self._record("rejoin", rejoin.name)

    def mark_node(self, mark: NodeMark, job: str) -> None:
        self._record("mark", mark.node)

    def bind_cluster_role(
        self, namespace: str, name: str, role: str, account: str, account_namespace: str
    ) -> None:
        self._record("bind", f"{namespace}/{role}")

    def save_config(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self._record("config", f"{namespace}/{name}")
        self.configs[(namespace, name)] = data

    def delete_job(self, body: dict[str, Any]) -> None:
        self._record("delete-job", body["metadata"]["name"])

    def event(self, body: dict[str, Any], spec: EventSpec) -> bool:
        self._record("event", spec.reason)
        return True

    def kinds(self) -> list[str]:
        return [what for what, _ in self.calls]
