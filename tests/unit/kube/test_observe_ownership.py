"""Only pods the job owns (by ownerReference uid) are the job's, whatever their labels say."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import cluster, job_body, lease, lease_owner, pod, running_status
from tests.unit.fakes import FakeReader

from tpujob.api import contract, labels
from tpujob.api.job import parse_job
from tpujob.kube.observe import observe, owned_by
from tpujob.plan.manifests import lease_name


def lease_name_of(body: dict[str, object]) -> str:
    return lease_name(parse_job(body))


def test_a_labelled_pod_without_the_jobs_owner_uid_is_ignored() -> None:
    job = job_body(status=running_status())
    ours = pod(job, 1, 0, 0)
    forged = pod(job, 1, 0, 1, phase="Failed", node_name="system-node")
    forged["metadata"]["ownerReferences"] = []
    previous_incarnation = pod(job, 1, 0, 1)
    previous_incarnation["metadata"]["ownerReferences"][0]["uid"] = "old-job-uid"
    seen = observe(FakeReader([ours, forged, previous_incarnation]), job)
    assert [p.name for p in seen.pods] == [ours["metadata"]["name"]]


def test_owned_by_needs_a_uid_to_match() -> None:
    obj = {"metadata": {"ownerReferences": [{"uid": "a"}, "junk"]}}
    assert owned_by(obj, "a")
    assert not owned_by(obj, "b")
    assert not owned_by(obj, None)
    assert not owned_by({"metadata": {}}, "a")


@pytest.mark.parametrize(
    ("signed_by", "counted"),
    [(None, True), ("own", True), ("old-job-uid", False)],
    ids=["unsigned", "signed-by-the-job", "signed-by-an-earlier-job-of-the-name"],
)
def test_a_heartbeat_signed_by_another_job_is_not_the_jobs(
    signed_by: str | None, counted: bool
) -> None:
    job = job_body(status=running_status())
    beat = lease(renewed=0, step=5)
    beat["metadata"].update(
        namespace=job["metadata"]["namespace"],
        name=lease_name_of(job),
        ownerReferences=lease_owner(job["metadata"]["name"], job["metadata"]["uid"]),
    )
    if signed_by is not None:
        uid = job["metadata"]["uid"] if signed_by == "own" else signed_by
        beat["metadata"]["annotations"][contract.HEARTBEAT_JOB_UID] = uid
    seen = observe(FakeReader([pod(job, 1, 0, 0)], lease=beat), job)
    assert (seen.heartbeat is not None) is counted


def _forged(job: dict[str, Any], how: str) -> dict[str, Any]:
    forged = pod(job, 1, 0, 1)
    if how == "renamed":
        forged["metadata"]["name"] = "innocent-looking"
    elif how == "other-pool-node":
        forged["spec"]["nodeName"] = "pool-2-w0"
    elif how == "control-plane-node":
        forged["spec"]["nodeName"] = "control-plane"
        forged["spec"]["nodeSelector"] = {}
    elif how == "unplaced-slice":
        forged["metadata"]["labels"][labels.SLICE] = "1"
        forged["metadata"]["name"] = f"{job['metadata']['name']}-1-1-1"
    elif how == "other-pool-selector":
        forged["spec"]["nodeSelector"][labels.NODEPOOL] = "pool-2"
        forged["spec"]["nodeName"] = "pool-2-w0"
    return forged


@pytest.mark.parametrize(
    ("how", "counted"),
    [
        ("as-made", True),
        ("renamed", False),
        ("other-pool-node", False),
        ("control-plane-node", False),
        ("other-pool-selector", False),
        ("unplaced-slice", False),
    ],
)
def test_a_pod_the_operator_could_not_have_made_is_not_the_jobs(how: str, counted: bool) -> None:
    """Owned by the job (its uid) and labelled as its worker 1, but named, placed or bound
    where the operator never puts its pods: a forgery, whose failure would blame that node."""
    job = job_body(status=running_status())
    control_plane = {"metadata": {"name": "control-plane", "uid": "uid-cp", "labels": {}}}
    nodes = [*cluster(), control_plane]
    seen = observe(FakeReader([pod(job, 1, 0, 0), _forged(job, how)], nodes=nodes), job)  # type: ignore[arg-type]
    assert (len(seen.pods) == 2) is counted, [p.name for p in seen.pods]


@pytest.mark.parametrize(
    ("recorded", "node", "selector", "counted"),
    [
        (None, None, None, True),  # pending, waiting for the autoscaler
        (None, "pool-1-w0", None, True),  # landed where the scheduler put it
        (None, "control-plane", None, False),  # bound to a node of no TPU pool
        (None, "pool-1-w0", "pool-1", False),  # an Autoscale slice's pod names no pool
        ("pool-1", "pool-1-w1", None, True),  # its pool learnt: the rest of the gang
        ("pool-1", "pool-2-w0", None, False),  # ... and never another pool
    ],
)
def test_an_autoscale_slices_pods_count_only_where_the_scheduler_could_have_put_them(
    recorded: str | None, node: str | None, selector: str | None, counted: bool
) -> None:
    status = running_status(pools=(recorded,) if recorded else ())
    job = job_body(status=status)
    job["spec"]["tpu"]["provisioning"] = "Autoscale"
    worker = pod(job, 1, 0, 0)
    worker["spec"]["nodeSelector"].pop(labels.NODEPOOL, None)
    if selector:
        worker["spec"]["nodeSelector"][labels.NODEPOOL] = selector
    if node:
        worker["spec"]["nodeName"] = node
    else:
        del worker["spec"]["nodeName"]
    control_plane = {"metadata": {"name": "control-plane", "uid": "uid-cp", "labels": {}}}
    seen = observe(FakeReader([worker], nodes=[*cluster(), control_plane]), job)  # type: ignore[arg-type]
    assert (len(seen.pods) == 1) is counted, [p.name for p in seen.pods]
