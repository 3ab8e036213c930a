"""Slices with no free pool: an ExistingPools job waits and says so once; an Autoscale job
launches pods the autoscaler can act on, one slice per pool, and records where they land."""

from __future__ import annotations

from typing import Any

from tests.unit.builders import T0, at, cluster, job_body, observed, pod, running_status

from tpujob.api import labels, parse_job
from tpujob.plan.manifests import AttemptSettings, gang, trainer_pod
from tpujob.plan.planner import plan


def autoscale_job(**extra: Any) -> dict[str, Any]:
    body = job_body(**extra)
    body["spec"]["tpu"]["provisioning"] = "Autoscale"
    return body


def busy_cluster() -> list[dict[str, Any]]:
    """Every pool's nodes cordoned: no pool is free."""
    return cluster(2, **{f"pool-{p}-w{w}": {"unschedulable": True} for p in (0, 1) for w in (0, 1)})


def test_an_existing_pools_job_waits_and_tells_it_once() -> None:
    first = plan(observed(job_body(), nodes=busy_cluster()), now=T0)
    assert first.create == ()
    running = first.status.condition("Running")
    assert running is not None and running.reason == "WaitingForPool"
    assert [e.reason for e in first.status.pending_events] == ["WaitingForPool"]
    again = job_body(status=first.status.model_dump(mode="json", by_alias=True))
    second = plan(observed(again, nodes=busy_cluster()), now=at(30))
    assert second.status.condition("Running") == running
    assert "WaitingForPool" not in [e.reason for e in second.status.pending_events]


def test_an_autoscale_job_with_no_free_pool_launches_pods_pinned_to_no_pool() -> None:
    result = plan(observed(autoscale_job(slices=2), nodes=busy_cluster()), now=T0)
    pods = [o for o in result.create if o["kind"] == "Pod"]
    assert len(pods) == 4
    for manifest in pods:
        assert labels.NODEPOOL not in manifest["spec"]["nodeSelector"]
        affinity = manifest["spec"]["affinity"]
        together = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        apart = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        mine = manifest["metadata"]["labels"][labels.GANG]
        assert together == {
            "labelSelector": {"matchLabels": {labels.GANG: mine}},
            "topologyKey": labels.NODEPOOL,
        }
        assert apart["topologyKey"] == labels.NODEPOOL and apart["namespaceSelector"] == {}
        assert {"key": labels.GANG, "operator": "NotIn", "values": [mine]} in apart[
            "labelSelector"
        ]["matchExpressions"]
    assert len({p["metadata"]["labels"][labels.GANG] for p in pods}) == 2
    running = result.status.condition("Running")
    assert running is not None and running.reason == "Provisioning"
    assert result.status.current_attempt.placement == ()
    assert "on a pool to be provisioned" in result.status.timeline[-1].message


def test_a_slice_keeps_its_gang_across_attempts_and_slices_differ() -> None:
    job = parse_job(autoscale_job(slices=2))
    assert gang(job, 0) == gang(job, 0) != gang(job, 1)
    first = trainer_pod(job, AttemptSettings(attempt=1, pools={}), 0, 0)
    later = trainer_pod(job, AttemptSettings(attempt=5, pools={}), 0, 1)
    assert first["metadata"]["labels"][labels.GANG] == later["metadata"]["labels"][labels.GANG]


def test_the_pool_a_provisioned_slice_lands_in_is_recorded_and_pins_its_pods() -> None:
    status = running_status(pools=())
    status["phase"] = "Starting"
    body = autoscale_job(status=status)
    bound = pod(body, 1, 0, 0, node_name="pool-1-w0", phase="Pending")
    bound["status"] = {"phase": "Pending"}
    result = plan(observed(body, pods=[bound], nodes=cluster(2)), now=at(20))
    assert [(p.slice, p.node_pool) for p in result.status.current_attempt.placement] == [
        (0, "pool-1")
    ]
    recreated = [o for o in result.create if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in recreated] == ["train-1-0-1"]
    assert recreated[0]["spec"]["nodeSelector"][labels.NODEPOOL] == "pool-1"
    assert "podAffinity" not in recreated[0]["spec"].get("affinity", {})
