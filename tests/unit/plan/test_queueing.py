"""Queueing through Kueue: held until admitted, placed on the flavor's nodes, stopped and
requeued on eviction, the quota given back at the end, and a job naming no queue untouched."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.builders import T0, at, iso, job_body, lease, node, observed, pod, running_status

from tpujob.api import ConditionType, Phase, contract, labels, parse_job
from tpujob.api.reasons import ConditionReason, TimelineKind
from tpujob.observed.admission import (
    PRIORITY_BOOST,
    WORK_SINCE_CHECKPOINT,
    WorkloadView,
    flavor_node_labels,
    parse_workload,
)
from tpujob.observed.views import Observed, heartbeat_view
from tpujob.plan import queueing
from tpujob.plan.placement import pools_of
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan, PlannerSettings, WorkloadPriority


def queued_job(status: dict[str, Any] | None = None, **meta_labels: str) -> dict[str, Any]:
    body = job_body(status=status)
    body["metadata"]["labels"] = {labels.QUEUE_NAME: "team-queue", **meta_labels}
    return body


def condition(kind: str, status: bool, reason: str = "R", message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": iso(T0),
    }


def workload(
    job: dict[str, Any],
    *,
    admitted: bool = False,
    evicted: str | None = None,
    flavor: str = "tpu-v4",
    active: bool = True,
    extra: tuple[dict[str, Any], ...] = (),
    queue: str = "team-queue",
) -> dict[str, Any]:
    conditions = [*extra]
    status: dict[str, Any] = {"conditions": conditions}
    if admitted:
        conditions += [condition("QuotaReserved", True), condition("Admitted", True)]
        status["admission"] = {
            "clusterQueue": "team-cq",
            "podSetAssignments": [
                {"name": "slice-0", "flavors": {labels.TPU_RESOURCE: flavor}, "count": 2}
            ],
        }
    if evicted is not None:
        conditions.append(condition("Evicted", True, evicted, "preempted by a higher priority"))
    return {
        "metadata": {
            "name": queueing.workload_name(parse_job(job)),
            "uid": "wl-uid",
            "resourceVersion": "7",
        },
        "spec": {"active": active, "queueName": queue},
        "status": status,
    }


FLAVORS = {"tpu-v4": {"team": "a"}, "tpu-v4-b": {"team": "b"}}


def seen(
    job: dict[str, Any],
    wl: dict[str, Any] | None = None,
    *,
    pods: list[dict[str, Any]] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    queueing_on: bool = True,
) -> Observed:
    obs = observed(job, pods, nodes=nodes)
    view = parse_workload(wl, lambda f: FLAVORS.get(f, {})) if wl is not None else None
    return replace(obs, queueing=queueing_on, workload=view)


def team_nodes() -> list[dict[str, Any]]:
    """pool-0 is team b's, pool-1 team a's (the flavor tpu-v4 selects team a)."""
    return [
        node(f"pool-{p}-w{w}", f"pool-{p}", node_labels={"team": "b" if p == 0 else "a"})
        for p in range(2)
        for w in range(2)
    ]


def suspended(result: Plan) -> tuple[str | None, str | None]:
    found = result.status.condition(ConditionType.SUSPENDED)
    return (found.reason, found.message) if found is not None else (None, None)


def test_a_new_queued_job_gets_a_workload_and_no_pods_until_admitted() -> None:
    job = queued_job()
    result = plan(seen(job), now=at(0))
    assert result.create == ()
    assert result.status.phase is Phase.SUSPENDED
    assert suspended(result) == (
        ConditionReason.WAITING_FOR_ADMISSION,
        "waiting for admission in queue team-queue",
    )
    assert result.workload is not None and result.workload.create is not None
    made = result.workload.create
    assert made["spec"]["queueName"] == "team-queue"
    assert made["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert [(p["name"], p["count"]) for p in made["spec"]["podSets"]] == [("slice-0", 2)]
    container = made["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"][labels.TPU_RESOURCE] == "4"
    assert [e.kind for e in result.status.timeline] == [TimelineKind.QUEUED]
    assert result.status.queue is not None and result.status.queue.waiting_since == at(0)


def test_a_job_naming_no_queue_is_untouched() -> None:
    result = plan(seen(job_body()), now=at(0))
    assert result.workload is None and result.status.queue is None
    assert any(o["kind"] == "Pod" for o in result.create)


def test_a_queued_job_waits_while_the_operator_runs_without_kueue() -> None:
    result = plan(seen(queued_job(), queueing_on=False), now=at(0))
    assert result.create == () and result.workload is None
    reason, message = suspended(result)
    assert reason == ConditionReason.WAITING_FOR_ADMISSION
    assert message is not None and "--kueue" in message


def test_an_admitted_job_starts_on_a_pool_of_its_flavor() -> None:
    job = queued_job({"phase": "Suspended", "queue": {"name": "team-queue"}})
    result = plan(seen(job, workload(job, admitted=True), nodes=team_nodes()), now=at(5))
    assert result.status.phase is Phase.STARTING
    assert pools_of(result.status.current_attempt) == {0: "pool-1"}
    assert {
        o["spec"]["nodeSelector"][labels.NODEPOOL] for o in result.create if o["kind"] == "Pod"
    } == {"pool-1"}
    assert result.status.queue is not None
    assert (result.status.queue.admitted, result.status.queue.cluster_queue) == (True, "team-cq")
    assert TimelineKind.ADMITTED in [e.kind for e in result.status.timeline]


def test_an_admitted_job_waits_when_no_pool_carries_its_flavor_labels() -> None:
    job = queued_job({"phase": "Suspended"})
    wl = workload(job, admitted=True, flavor="tpu-v4-b")
    nodes = [node(f"pool-1-w{w}", "pool-1", node_labels={"team": "a"}) for w in range(2)]
    result = plan(seen(job, wl, nodes=nodes), now=at(5))
    assert not any(o["kind"] == "Pod" for o in result.create)


def test_an_eviction_stops_the_pods_gracefully_and_clears_the_admission_once_they_are_gone() -> (
    None
):
    job = queued_job(running_status(queue={"name": "team-queue", "admitted": True}))
    wl = workload(job, admitted=True, evicted="Preempted")
    running = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    stopping = plan(seen(job, wl, pods=running), now=at(60))
    assert [(d.name, d.grace_seconds) for d in stopping.delete_pods] == [
        ("train-1-0-0", None),
        ("train-1-0-1", None),
    ]
    assert stopping.status.phase is Phase.SUSPENDED
    assert suspended(stopping)[0] == ConditionReason.EVICTED
    assert stopping.status.queue is not None and stopping.status.queue.evictions == 1
    assert stopping.workload is None  # the quota is kept until the pods are gone
    gone = replace(seen(job, wl), job=seen(job).job.model_copy(update={"status": stopping.status}))
    cleared = plan(gone, now=at(70))
    assert cleared.workload is not None and cleared.workload.clear_admission
    assert cleared.workload.resource_version == "7"
    written = {c["type"]: (c["status"], c["reason"]) for c in cleared.workload.conditions or ()}
    assert written["QuotaReserved"] == ("False", "Pending")
    assert written["Requeued"] == ("True", "Preempted")
    assert cleared.status.queue is not None and cleared.status.queue.evictions == 1


def test_time_waiting_after_a_preemption_counts_as_queued_not_downtime() -> None:
    job = queued_job(
        {
            "phase": "Suspended",
            "attempt": 1,
            "startTime": iso(T0),
            "queue": {"name": "team-queue", "waitingSince": iso(at(100))},
        }
    )
    result = plan(seen(job, workload(job, admitted=True), nodes=team_nodes()), now=at(160))
    assert result.status.queue is not None
    assert result.status.queue.queued_seconds == pytest.approx(60)
    parts = result.status.goodput_breakdown
    assert parts is not None and parts.queued == pytest.approx(60)


def test_a_finished_job_tells_kueue_once() -> None:
    job = queued_job({"phase": "Succeeded", "completionTime": iso(at(50)), "startTime": iso(T0)})
    result = plan(seen(job, workload(job, admitted=True)), now=at(51))
    assert result.workload is not None
    assert [(c["type"], c["status"], c["reason"]) for c in result.workload.conditions or ()][
        -1
    ] == ("Finished", "True", "Succeeded")
    told = workload(job, admitted=True, extra=(condition("Finished", True, "Succeeded"),))
    assert plan(seen(job, told), now=at(52)).workload is None


def test_a_running_job_whose_queue_label_is_removed_stays_in_its_queue_until_it_ends() -> None:
    admitted = {"queue": {"name": "team-queue", "admitted": True}}
    job = job_body(status=running_status(**admitted))
    wl = workload(job, admitted=True)
    workers = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    result = plan(seen(job, wl, pods=workers), now=at(20))
    assert result.delete_pods == () and result.status.phase is Phase.RUNNING
    assert result.status.queue is not None and result.status.queue.name == "team-queue"
    said = [e.message for e in result.status.timeline if e.kind == TimelineKind.QUEUED]
    assert said == [
        "the queue label was removed; the job stays in queue team-queue, where its Workload "
        "holds quota, until it ends or is evicted (a job's queue is fixed once it is queued: "
        "re-create the job to move it)"
    ]
    assert [e.reason for e in result.events] == ["QueueLabelIgnored"]
    # Said once.
    again = job_body(status=result.status.model_dump(by_alias=True, mode="json"))
    later = plan(seen(again, wl, pods=workers), now=at(21))
    assert [e.message for e in later.status.timeline if e.kind == TimelineKind.QUEUED] == said
    assert later.status.pending_events == ()
    # Its end releases the quota as for any queued job.
    done = job_body(
        status={"phase": "Succeeded", "completionTime": iso(at(50)), "startTime": iso(T0)}
    )
    finished = plan(seen(done, workload(done, admitted=True)), now=at(51)).workload
    assert finished is not None
    assert ("Finished", "True") in [(c["type"], c["status"]) for c in finished.conditions or ()]


def test_a_waiting_job_whose_queue_label_is_removed_leaves_the_queue_and_starts() -> None:
    job = job_body(status={"phase": "Suspended", "queue": {"name": "team-queue"}})
    result = plan(seen(job, workload(job)), now=at(5))
    assert result.workload is not None and result.workload.active is False
    assert result.status.queue is None
    assert any(o["kind"] == "Pod" for o in result.create)
    assert result.status.timeline[0].message == (
        "left queue team-queue: its queue label was removed while it waited; the job runs "
        "without a queue"
    )


def test_a_waiting_job_whose_queue_label_names_another_queue_waits_where_it_is() -> None:
    job = queued_job({"phase": "Suspended"})
    job["metadata"]["labels"][labels.QUEUE_NAME] = "other-queue"
    result = plan(seen(job, workload(job)), now=at(5))
    assert result.create == ()
    assert suspended(result) == (
        ConditionReason.WAITING_FOR_ADMISSION,
        "waiting for admission in queue team-queue",
    )
    assert result.status.queue is not None and result.status.queue.name == "team-queue"
    said = [e.message for e in result.status.timeline]
    assert any(m.startswith("the label asks for queue other-queue; the job stays") for m in said)


def test_pods_ready_is_told_when_every_worker_runs() -> None:
    job = queued_job(running_status(queue={"name": "team-queue", "admitted": True}))
    wl = workload(job, admitted=True)
    one = plan(seen(job, wl, pods=[pod(job, 1, 0, 0)]), now=at(20))
    assert one.workload is not None
    assert {c["type"]: c["reason"] for c in one.workload.conditions or ()}["PodsReady"] == (
        "WaitForStart"
    )
    both = plan(seen(job, wl, pods=[pod(job, 1, 0, 0), pod(job, 1, 0, 1)]), now=at(20))
    assert both.workload is not None
    assert {c["type"]: c["status"] for c in both.workload.conditions or ()}["PodsReady"] == "True"
    ready = workload(job, admitted=True, extra=(condition("PodsReady", True, "Started"),))
    assert (
        plan(seen(job, ready, pods=[pod(job, 1, 0, 0), pod(job, 1, 0, 1)]), now=at(21)).workload
        is None
    )


def test_a_suspended_queued_job_deactivates_its_workload() -> None:
    job = queued_job({"phase": "Suspended"})
    job["spec"]["suspend"] = True
    result = plan(seen(job, workload(job)), now=at(5))
    assert result.workload is not None and result.workload.active is False


@pytest.mark.parametrize(
    ("job_labels", "pod_class", "expected"),
    [
        ({}, None, None),
        ({}, "high", WorkloadPriority("scheduling.k8s.io", "PriorityClass", "high")),
        (
            {queueing.PRIORITY_CLASS_LABEL: "urgent"},
            "high",
            WorkloadPriority("kueue.x-k8s.io", "WorkloadPriorityClass", "urgent"),
        ),
    ],
    ids=["none", "pod-priority-class", "workload-priority-class-first"],
)
def test_the_workload_priority_comes_from_kueues_label_then_the_pods_class(
    job_labels: dict[str, str], pod_class: str | None, expected: WorkloadPriority | None
) -> None:

    body = queued_job(**job_labels)
    if pod_class:
        body["spec"]["trainer"]["podTemplate"] = {"spec": {"priorityClassName": pod_class}}
    assert queueing.workload_priority(parse_job(body)) == expected


def test_a_multislice_job_has_a_pod_set_per_slice_up_to_kueues_limit() -> None:

    few = job_body(slices=2)
    many = job_body(slices=queueing.MAX_POD_SETS + 1)
    assert [p["name"] for p in queueing.workload_manifest(parse_job(few))["spec"]["podSets"]] == [
        "slice-0",
        "slice-1",
    ]
    (whole,) = queueing.workload_manifest(parse_job(many))["spec"]["podSets"]
    assert whole["count"] == 2 * (queueing.MAX_POD_SETS + 1)


def test_a_workload_is_read_bounded_and_admitted_only_with_quota_and_admission() -> None:
    job = queued_job()
    reserved_only = workload(job)
    reserved_only["status"]["conditions"] = [condition("QuotaReserved", True)]
    reserved_only["status"]["admission"] = {"clusterQueue": "cq", "podSetAssignments": []}
    view: WorkloadView = parse_workload(reserved_only)
    assert view.quota_reserved and not view.admitted
    noisy = {"spec": {"nodeLabels": {f"k{i}": "v" for i in range(100)}}}
    assert len(flavor_node_labels(noisy)) == 32
    assert parse_workload({"status": {"conditions": "not a list"}}).conditions == ()


def test_a_job_with_spares_holds_none_while_queued() -> None:
    job = queued_job(running_status(queue={"name": "team-queue", "admitted": True}))
    job["spec"]["tpu"]["spares"] = 1
    job["spec"]["tpu"]["provisioning"] = "ExistingPools"
    result = plan(
        seen(job, workload(job, admitted=True), pods=[pod(job, 1, 0, 0), pod(job, 1, 0, 1)]),
        now=at(20),
    )
    assert result.status.spares == ()
    assert not any(o["metadata"].get("labels", {}).get(labels.SPARE) for o in result.create)


def beat(*, step: int, saved: int, rate: float = 1.0) -> dict[str, Any]:
    body = lease(renewed=19, step=step)
    notes = body["metadata"]["annotations"]
    notes[contract.HEARTBEAT_CHECKPOINT_STEP] = str(saved)
    notes[contract.HEARTBEAT_STEPS_PER_SECOND] = str(rate)
    return body


@pytest.mark.parametrize(
    ("step", "saved", "boost_before", "unit", "written"),
    [
        (130, 10, None, 60.0, {PRIORITY_BOOST: "2", WORK_SINCE_CHECKPOINT: "120"}),
        (130, 120, None, 60.0, {PRIORITY_BOOST: "0", WORK_SINCE_CHECKPOINT: "10"}),
        (
            1000,
            0,
            None,
            60.0,
            {PRIORITY_BOOST: str(queueing.MAX_BOOST), WORK_SINCE_CHECKPOINT: "1000"},
        ),
        (130, 10, "2", 60.0, None),
        (130, 120, None, 4.0, {PRIORITY_BOOST: "2", WORK_SINCE_CHECKPOINT: "10"}),
    ],
    ids=["two-minutes-at-risk", "just-saved", "capped", "unchanged-no-write", "finer-points"],
)
def test_a_running_job_publishes_the_work_a_preemption_would_lose_as_a_priority_boost(
    step: int, saved: int, boost_before: str | None, unit: float, written: dict[str, str] | None
) -> None:
    job = queued_job(running_status(queue={"name": "team-queue", "admitted": True}))
    wl = workload(job, admitted=True, extra=(condition("PodsReady", True, "Started"),))
    if boost_before is not None:
        wl["metadata"]["annotations"] = {PRIORITY_BOOST: boost_before}
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    obs = replace(seen(job, wl, pods=pods), heartbeat=heartbeat_view(beat(step=step, saved=saved)))
    result = plan(obs, now=at(20), settings=PlannerSettings(preemption_boost_seconds=unit))
    got = result.workload.annotations if result.workload is not None else None
    assert got == written


def test_a_job_no_longer_running_takes_its_boost_off() -> None:
    job = queued_job(running_status(queue={"name": "team-queue", "admitted": True}))
    wl = workload(job, admitted=True, evicted="Preempted")
    wl["metadata"]["annotations"] = {PRIORITY_BOOST: "3"}
    result = plan(seen(job, wl, pods=[pod(job, 1, 0, 0), pod(job, 1, 0, 1)]), now=at(20))
    assert result.workload is not None
    assert result.workload.annotations == {PRIORITY_BOOST: None, WORK_SINCE_CHECKPOINT: None}


def provisioning_check(state: str = "Ready", **update: Any) -> dict[str, Any]:
    """An admission check as a ProvisioningRequest's controller leaves it on the Workload."""
    return {
        "name": "dws-prov",
        "state": state,
        "podSetUpdates": [
            {
                "name": "slice-0",
                "annotations": {
                    "autoscaling.x-k8s.io/consume-provisioning-request": "wl-prov-1",
                    "cluster-autoscaler.kubernetes.io/provisioning-class-name": "queued",
                },
                **update,
            }
        ],
    }


def test_an_admitted_jobs_pods_carry_what_its_admission_checks_ask_under_the_operators_own() -> (
    None
):
    job = queued_job({"phase": "Suspended", "queue": {"name": "team-queue"}})
    wl = workload(job, admitted=True)
    wl["status"]["admissionChecks"] = [
        provisioning_check(
            labels={labels.JOB: "someone-else", "capacity": "dws"},
            nodeSelector={labels.NODEPOOL: "pool-0", "cloud.google.com/gke-queued": "true"},
            tolerations=[
                {
                    "key": "cloud.google.com/gke-queued",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                    "bogus": "dropped",
                }
            ],
        ),
        # A check still pending asks nothing yet.
        {
            "name": "other",
            "state": "Pending",
            "podSetUpdates": [{"name": "slice-0", "labels": {"x": "y"}}],
        },
    ]
    result = plan(seen(job, wl, nodes=team_nodes()), now=at(5))
    pods = [o for o in result.create if o["kind"] == "Pod"]
    assert len(pods) == 2
    for made in pods:
        meta, spec = made["metadata"], made["spec"]
        assert (
            meta["annotations"]["autoscaling.x-k8s.io/consume-provisioning-request"] == "wl-prov-1"
        )
        assert meta["labels"]["capacity"] == "dws" and "x" not in meta["labels"]
        # The operator's own keys win: the job label and the pool the slice was placed on.
        assert meta["labels"][labels.JOB] == job["metadata"]["name"]
        assert spec["nodeSelector"][labels.NODEPOOL] == "pool-1"
        assert spec["nodeSelector"]["cloud.google.com/gke-queued"] == "true"
        assert {
            "key": "cloud.google.com/gke-queued",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        } in spec["tolerations"]


def test_pod_set_updates_apply_only_once_admitted_and_only_to_their_pod_set() -> None:
    job = queued_job({"phase": "Suspended", "queue": {"name": "team-queue"}})
    wl = workload(job, admitted=False)
    wl["status"]["admissionChecks"] = [provisioning_check()]
    obs = seen(job, wl, nodes=team_nodes())
    assert queueing.pod_set_updates(obs) == {}
    wl = workload(job, admitted=True)
    wl["status"]["admissionChecks"] = [provisioning_check(), provisioning_check()]
    wl["status"]["admissionChecks"][1]["podSetUpdates"][0]["name"] = "slice-7"
    found = queueing.pod_set_updates(seen(job, wl, nodes=team_nodes()))
    assert list(found) == [0]


def test_pod_set_updates_are_read_bounded() -> None:
    job = queued_job()
    wl = workload(job, admitted=True)
    wl["status"]["admissionChecks"] = [
        provisioning_check(
            labels={f"k{i}": "v" * 1000 for i in range(100)},
            tolerations=[{"key": f"t{i}"} for i in range(50)] + ["not a toleration"],
        )
    ]
    update = parse_workload(wl).pod_set_updates["slice-0"]
    assert len(update.labels) == 32 and all(len(v) == 256 for v in update.labels.values())
    assert len(update.tolerations) == 8
