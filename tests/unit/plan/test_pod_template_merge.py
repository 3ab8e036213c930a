"""A job's pod template on its worker pods: added under the operator's fields, and placement
only on pools its node selectors match."""

from __future__ import annotations

from typing import Any

from tests.unit.builders import T0, cluster, job_body, observed

from tpujob.api import labels, parse_job
from tpujob.api.pod_template import PodMetadata, PodSpecAdditions, PodTemplate
from tpujob.plan.manifests import AttemptSettings, trainer_pod
from tpujob.plan.planner import plan
from tpujob.plan.pod_template import HOST_NETWORK_DNS_POLICY, add_template

RESERVATION = "cloud.google.com/reservation-name"


def with_template(**trainer: Any) -> dict[str, Any]:
    body = job_body()
    body["spec"]["trainer"].update(trainer)
    return body


def worker(body: dict[str, Any]) -> dict[str, Any]:
    return trainer_pod(parse_job(body), AttemptSettings(attempt=1, pools={0: "pool-0"}), 0, 0)


def test_template_fields_are_on_every_worker_pod_beside_the_operators() -> None:
    pod = worker(
        with_template(
            volumeMounts=[{"name": "shm", "mountPath": "/dev/shm"}],
            podTemplate={
                "metadata": {"labels": {"team": "vision"}, "annotations": {"a.io/b": "c"}},
                "spec": {
                    "tolerations": [{"key": "cloud.google.com/gke-spot", "value": "true"}],
                    "nodeSelector": {RESERVATION: "r1"},
                    "priorityClassName": "high",
                    "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
                    "imagePullSecrets": [{"name": "registry"}],
                },
            },
        )
    )
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"]["team"] == "vision" and meta["labels"][labels.JOB] == "train"
    assert meta["annotations"] == {"a.io/b": "c"}
    assert spec["nodeSelector"][RESERVATION] == "r1"
    assert spec["nodeSelector"][labels.NODEPOOL] == "pool-0"
    assert [t["key"] for t in spec["tolerations"]] == [
        labels.TPU_RESOURCE,
        "cloud.google.com/gke-spot",
    ]
    assert spec["priorityClassName"] == "high"
    assert spec["imagePullSecrets"] == [{"name": "registry"}]
    assert {"name": "shm", "emptyDir": {"medium": "Memory"}} in spec["volumes"]
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert mounts == {"/tmp": "tmp", "/var/run/tpujob": "tpujob-rejoin", "/dev/shm": "shm"}
    assert "hostNetwork" not in spec


def test_host_network_pods_resolve_cluster_names() -> None:
    spec = worker(with_template(podTemplate={"spec": {"hostNetwork": True}}))["spec"]
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == HOST_NETWORK_DNS_POLICY


def test_operator_fields_win_over_a_template_admitted_before_a_rule_refused_them() -> None:
    # Built without validation: what a job stored under an older CRD could hold.
    stale = PodTemplate.model_construct(
        metadata=PodMetadata.model_construct(labels={labels.JOB: "other"}, annotations={}),
        spec=PodSpecAdditions.model_construct(
            tolerations=(),
            node_selector={labels.NODEPOOL: "elsewhere"},
            priority_class_name=None,
            volumes=(),
            host_network=False,
            image_pull_secrets=(),
        ),
    )
    pod = add_template(
        {
            "metadata": {"labels": {labels.JOB: "train"}},
            "spec": {"nodeSelector": {labels.NODEPOOL: "pool-0"}, "containers": [{}]},
        },
        stale,
    )
    assert pod["metadata"]["labels"][labels.JOB] == "train"
    assert pod["spec"]["nodeSelector"][labels.NODEPOOL] == "pool-0"


def test_a_slice_is_placed_only_on_a_pool_its_node_selectors_match() -> None:
    nodes = cluster(3)
    for n in nodes:
        if n["metadata"]["labels"][labels.NODEPOOL] == "pool-2":
            n["metadata"]["labels"][RESERVATION] = "r1"
    body = with_template(podTemplate={"spec": {"nodeSelector": {RESERVATION: "r1"}}})
    result = plan(observed(body, nodes=nodes), now=T0)
    assert [p.node_pool for p in result.status.current_attempt.placement] == ["pool-2"]
    pods = [o for o in result.create if o["kind"] == "Pod"]
    assert {p["spec"]["nodeSelector"][labels.NODEPOOL] for p in pods} == {"pool-2"}


def test_a_job_whose_selectors_match_no_pool_waits_for_one() -> None:
    body = with_template(podTemplate={"spec": {"nodeSelector": {RESERVATION: "none"}}})
    result = plan(observed(body, nodes=cluster(3)), now=T0)
    assert result.create == ()
    running = result.status.condition("Running")
    assert running is not None and running.reason == "WaitingForPool"
