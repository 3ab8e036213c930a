"""Only pods the job owns (by ownerReference uid) are the job's, whatever their labels say."""

from __future__ import annotations

from tests.unit.builders import job_body, pod, running_status
from tests.unit.fakes import FakeReader

from tpujob.kube.observe import observe, owned_by


def test_a_labelled_pod_without_the_jobs_owner_uid_is_ignored() -> None:
    job = job_body(status=running_status())
    ours = pod(job, 1, 0, 0)
    forged = pod(job, 1, 0, 1, phase="Failed", node_name="system-node")
    forged["metadata"]["ownerReferences"] = []
    previous_incarnation = pod(job, 1, 0, 1)
    previous_incarnation["metadata"]["ownerReferences"][0]["uid"] = "old-job-uid"
    seen = observe(FakeReader([ours, forged, previous_incarnation]), job)  # type: ignore[arg-type]
    assert [p.name for p in seen.pods] == [ours["metadata"]["name"]]


def test_owned_by_needs_a_uid_to_match() -> None:
    obj = {"metadata": {"ownerReferences": [{"uid": "a"}, "junk"]}}
    assert owned_by(obj, "a")
    assert not owned_by(obj, "b")
    assert not owned_by(obj, None)
    assert not owned_by({"metadata": {}}, "a")
