"""`tpujob release-jobs`: the operator stops before any finalizer goes, only its own finalizer
goes, and a job changed in between is read again rather than overwritten."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tpujob import release
from tpujob.api.labels import FINALIZER
from tpujob.cli_output import CommandError

OTHER = "example.com/backup"


class Jobs:
    """TPUTrainingJobs by (namespace, name), with resourceVersions checked on patch as the
    apiserver does; `interfere` changes a job between a read and the next patch."""

    def __init__(self, *jobs: tuple[str, str, list[str]]) -> None:
        self.store: dict[tuple[str, str], dict[str, Any]] = {
            (ns, name): {
                "metadata": {
                    "namespace": ns,
                    "name": name,
                    "finalizers": list(fins),
                    "resourceVersion": "1",
                }
            }
            for ns, name, fins in jobs
        }
        self.interfere: list[str] = []
        self.patches = 0
        self.gone: set[str] = set()  # namespaces deleted, with the operator's Role in them

    def list_namespaced_custom_object(self, g: str, v: str, ns: str, p: str, **kw: Any) -> Any:
        if ns in self.gone:
            raise ApiException(status=403, reason="Forbidden")
        name = kw.get("field_selector", "").removeprefix("metadata.name=")
        items = [
            copy.deepcopy(job)
            for (jns, jname), job in self.store.items()
            if jns == ns and (not name or jname == name)
        ]
        if self.interfere:
            meta = self.store[(ns, name)]["metadata"]
            meta["finalizers"].append(self.interfere.pop())
            meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return {"items": items}

    def list_cluster_custom_object(self, g: str, v: str, p: str, **kw: Any) -> Any:
        return {"items": [copy.deepcopy(job) for job in self.store.values()]}

    def patch_namespaced_custom_object(self, *args: Any, **kw: Any) -> Any:
        ns, name, body = args[2], args[4], args[5]
        self.patches += 1
        meta = self.store[(ns, name)]["metadata"]
        if body["metadata"]["resourceVersion"] != meta["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        meta["finalizers"] = body["metadata"]["finalizers"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return {}


def test_only_the_operators_finalizer_is_removed_and_a_job_without_it_is_left_alone() -> None:
    jobs = Jobs(("a", "mine", [OTHER, FINALIZER]), ("a", "plain", [OTHER]))
    assert release.release_job(jobs, "a", "mine") is True
    assert release.release_job(jobs, "a", "plain") is False
    assert jobs.store[("a", "mine")]["metadata"]["finalizers"] == [OTHER]
    assert jobs.store[("a", "plain")]["metadata"]["finalizers"] == [OTHER]
    assert jobs.patches == 1


def test_a_finalizer_added_between_read_and_patch_is_kept() -> None:
    jobs = Jobs(("a", "busy", [FINALIZER]))
    jobs.interfere = [OTHER]
    assert release.release_job(jobs, "a", "busy") is True
    assert jobs.store[("a", "busy")]["metadata"]["finalizers"] == [OTHER]
    assert jobs.patches == 2  # the first, on the stale read, was refused


def test_a_watched_namespace_deleted_before_the_uninstall_is_skipped_not_fatal() -> None:
    jobs = Jobs(("a", "one", [FINALIZER]), ("b", "two", [FINALIZER]))
    jobs.gone = {"gone"}
    found, skipped = release._jobs(jobs, ["a", "gone", "b"])
    assert found == [("a", "one"), ("b", "two")]
    assert skipped == ["gone"]


def test_a_job_gone_before_it_is_released_is_no_error() -> None:
    assert release.release_job(Jobs(), "a", "gone") is False


def test_a_job_that_keeps_changing_stops_the_command_with_a_message() -> None:
    jobs = Jobs(("a", "churn", [FINALIZER]))
    jobs.interfere = [f"x/{i}" for i in range(release.CONFLICT_RETRIES)]
    with pytest.raises(CommandError, match="a/churn"):
        release.release_job(jobs, "a", "churn")


class Cluster:
    """A Deployment whose pods go `after` polls once it is scaled to zero."""

    def __init__(self, *, exists: bool = True, after: int = 2) -> None:
        self.exists, self.after, self.scaled, self.polls = exists, after, False, 0

    def read_namespaced_deployment(self, name: str, ns: str, **kw: Any) -> Any:
        if not self.exists:
            raise ApiException(status=404, reason="NotFound")
        labels = {"app.kubernetes.io/name": "tpujob-operator"}
        return SimpleNamespace(spec=SimpleNamespace(selector=SimpleNamespace(match_labels=labels)))

    def patch_namespaced_deployment_scale(self, name: str, ns: str, body: Any, **kw: Any) -> Any:
        assert body == {"spec": {"replicas": 0}}
        self.scaled = True

    def list_namespaced_pod(self, ns: str, **kw: Any) -> Any:
        assert kw["label_selector"] == "app.kubernetes.io/name=tpujob-operator"
        self.polls += 1
        left = self.polls <= self.after or not self.scaled
        pods = [SimpleNamespace(metadata=SimpleNamespace(name="op-1"))] if left else []
        return SimpleNamespace(items=pods)


def _stop(cluster: Cluster, timeout: float) -> list[float]:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    release.stop_operator(
        cluster, cluster, "sys", "op", timeout=timeout, sleep=sleep, clock=lambda: now[0]
    )
    return now


@pytest.mark.parametrize(
    ("exists", "after", "scaled", "waited"),
    [
        pytest.param(True, 0, True, 0.0, id="pods-already-gone"),
        pytest.param(True, 3, True, 3.0, id="waits-for-the-replicas-to-stop"),
        pytest.param(False, 0, False, 0.0, id="deployment-already-deleted"),
    ],
)
def test_the_operator_is_scaled_to_zero_and_awaited_before_jobs_are_touched(
    exists: bool, after: int, scaled: bool, waited: float
) -> None:
    cluster = Cluster(exists=exists, after=after)
    assert _stop(cluster, timeout=60)[0] == waited
    assert cluster.scaled is scaled


def test_replicas_that_never_stop_end_the_command_naming_them() -> None:
    with pytest.raises(CommandError, match="op-1"):
        _stop(Cluster(after=10_000), timeout=5)
