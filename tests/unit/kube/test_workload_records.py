"""The watch-fed record of a Workload keeps what the plan reads of it, and only that."""

from __future__ import annotations

from tpujob.api import labels
from tpujob.kube.workloads import workload_for, workload_record
from tpujob.observed.admission import PRIORITY_BOOST


def raw_workload(**meta: object) -> dict[str, object]:
    return {
        "metadata": {
            "name": "tpujob-train-1234abcd",
            "namespace": "team",
            "uid": "wl-uid",
            "resourceVersion": "9",
            "labels": {labels.JOB: "train"},
            "ownerReferences": [{"uid": "job-uid"}],
            "annotations": {PRIORITY_BOOST: "3", "someone.else/note": "x" * 10_000},
            "managedFields": [{"manager": "kueue"}] * 50,
            **meta,
        },
        "spec": {"active": True, "queueName": "team-queue", "podSets": [{"count": 64}] * 8},
        "status": {"conditions": [], "admission": None, "resourceRequests": [{}] * 8},
    }


def test_a_workload_record_keeps_its_queue_owner_and_boost_and_drops_the_rest() -> None:
    record = workload_record(raw_workload())
    assert list(record) == [("team", "train")]
    kept = record[("team", "train")]
    assert kept.owners == frozenset({"job-uid"})
    assert kept.raw["spec"] == {"active": True, "queueName": "team-queue"}
    assert kept.raw["metadata"]["annotations"] == {PRIORITY_BOOST: "3"}
    assert "managedFields" not in kept.raw["metadata"]
    view = workload_for(
        {("team", "train"): [kept]}, {}, ("team", "train"), uid="job-uid", name=kept.name
    )
    assert view is not None
    assert (view.queue_name, view.boost, view.active) == ("team-queue", 3, True)


def test_a_workload_owned_by_another_uid_does_not_stand_for_the_job() -> None:
    kept = workload_record(raw_workload(ownerReferences=[{"uid": "intruder"}]))[("team", "train")]
    found = workload_for(
        {("team", "train"): [kept]}, {}, ("team", "train"), uid="job-uid", name=kept.name
    )
    assert found is None


def test_a_workload_record_keeps_the_pod_set_updates_of_ready_checks_bounded() -> None:
    update = {
        "name": "slice-0",
        "annotations": {"autoscaling.x-k8s.io/consume-provisioning-request": "prov"},
        "labels": {f"k{i}": "v" for i in range(1000)},
        "tolerations": [{"key": "example.com/provisioned", "operator": "Exists"}] * 50,
    }
    raw = raw_workload()
    raw["status"] = {
        "admissionChecks": [
            {"name": "prov", "state": "Ready", "podSetUpdates": [update]},
            {"name": "pending", "state": "Pending", "podSetUpdates": [{**update, "name": "x"}]},
        ]
    }
    kept = workload_record(raw)[("team", "train")]
    view = workload_for(
        {("team", "train"): [kept]}, {}, ("team", "train"), uid="job-uid", name=kept.name
    )
    assert view is not None
    assert list(view.pod_set_updates) == ["slice-0"]
    found = view.pod_set_updates["slice-0"]
    assert found.annotations == {"autoscaling.x-k8s.io/consume-provisioning-request": "prov"}
    assert len(found.labels) == 32 and len(found.tolerations) == 8
