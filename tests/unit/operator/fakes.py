"""Fakes of the operator's own adapter (Reader, Writer) that record what the shell does."""

from __future__ import annotations

from typing import Any

from tests.unit.operator.builders import cluster

from tpujob.kube.errors import KubeError
from tpujob.plan import EventSpec, NodeMark, PodDeletion


class FakeReader:
    """The reads `observe` makes, over fixed objects."""

    def __init__(self, pods: list[dict[str, Any]], body: dict[str, Any] | None = None,
                 lease: dict[str, Any] | None = None,
                 nodes: list[dict[str, Any]] | None = None) -> None:
        self._pods, self.body, self._lease = pods, body, lease
        self._nodes = nodes if nodes is not None else cluster()

    def job_body(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.body

    def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return self._pods

    def nodes(self) -> list[dict[str, Any]]:
        return self._nodes

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._lease

    def busy_pools(self, namespace: str, job: str) -> frozenset[str]:
        return frozenset()

    def log_tail(self, namespace: str, pod: str) -> str:
        return ""




class RecordingWriter:
    """Records every effect in order; `fail` maps an effect name to the error it raises."""

    def __init__(self, fail: dict[str, KubeError] | None = None) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail = fail or {}
        self.statuses: list[dict[str, Any]] = []

    def _record(self, what: str, detail: str) -> None:
        self.calls.append((what, detail))
        if what in self.fail:
            raise self.fail[what]

    def write_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self._record("status", str(status.get("phase")))
        self.statuses.append(status)
        return {**body, "status": status}

    def fence(self, lease: dict[str, Any], attempt: int) -> None:
        self._record("fence", str(attempt))

    def create(self, obj: dict[str, Any]) -> bool:
        self._record("create", f"{obj['kind']}/{obj['metadata']['name']}")
        if obj["kind"] == "Pod" and "create-pod" in self.fail:
            raise self.fail["create-pod"]
        return True

    def delete_pod(self, namespace: str, deletion: PodDeletion) -> None:
        self._record("delete", deletion.name)

    def mark_node(self, mark: NodeMark, job: str) -> None:
        self._record("mark", mark.node)

    def delete_job(self, body: dict[str, Any]) -> None:
        self._record("delete-job", body["metadata"]["name"])

    def event(self, body: dict[str, Any], spec: EventSpec) -> None:
        self._record("event", spec.reason)

    def kinds(self) -> list[str]:
        return [what for what, _ in self.calls]
