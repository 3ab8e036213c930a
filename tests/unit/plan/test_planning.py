"""The planner's decisions, from observed cluster state to the next status and effects."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import (
    T0,
    at,
    cluster,
    job_body,
    lease,
    observed,
    pod,
    running_status,
    trainer_message,
)

from tpujob.api import BadNodeAction, Phase, contract, labels, parse_job
from tpujob.plan.manifests import AttemptSettings, trainer_pod
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan


def two_workers(job: dict[str, Any], **worker1: Any) -> list[dict[str, Any]]:
    return [pod(job, 1, 0, 0), pod(job, 1, 0, 1, **worker1)]


def deleted(result: Plan) -> dict[str, int | None]:
    return {d.name: d.grace_seconds for d in result.delete_pods}


def test_new_job_gets_attempt_one_on_a_free_healthy_pool() -> None:
    nodes = cluster(3, **{"pool-0-w1": {"ready": "Unknown"}})
    result = plan(observed(job_body(), nodes=nodes), now=T0)
    assert result.status.attempt == 1
    assert result.status.phase is Phase.STARTING
    assert [p.node_pool for p in result.status.current_attempt.placement] == ["pool-1"]
    # Launched in the same reconcile: its status (written before any effect) records the
    # attempt and the launch, and the fence goes on the Lease before the pods.
    assert result.status.current_attempt.launched_time == T0
    assert result.fence_attempt == 1
    pods = [o for o in result.create if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["train-1-0-0", "train-1-0-1"]
    assert all(p["spec"]["nodeSelector"][labels.NODEPOOL] == "pool-1" for p in pods), [
        p["spec"]["nodeSelector"] for p in pods
    ]


def test_a_new_job_without_a_free_pool_is_planned_and_waits() -> None:
    nodes = cluster(1, **{"pool-0-w1": {"ready": "Unknown"}})
    result = plan(observed(job_body(), nodes=nodes), now=T0)
    assert (result.status.attempt, result.status.phase) == (1, Phase.STARTING)
    assert result.create == ()
    running = result.status.condition("Running")
    assert running is not None and running.reason == "WaitingForPool"


@pytest.mark.parametrize("framework", ["jax", "tensorflow"])
def test_planned_attempt_launches_its_pods_with_the_gke_environment(framework: str) -> None:
    job = job_body(
        framework=framework,
        status={
            "phase": "Starting",
            "attempt": 1,
            "startTime": "2026-01-01T12:00:00Z",
            "currentAttempt": {"placement": [{"slice": 0, "nodePool": "pool-1"}]},
        },
    )
    result = plan(observed(job), now=at(1))
    pods = [o for o in result.create if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["train-1-0-0", "train-1-0-1"]
    env = {e["name"]: e["value"] for e in pods[1]["spec"]["containers"][0]["env"]}
    assert env["TPU_WORKER_ID"] == "1"
    assert env["JAX_PROCESS_ID"] == "1"
    assert env["JAX_NUM_PROCESSES"] == "2"
    assert env["TPU_WORKER_HOSTNAMES"].split(",")[0].startswith("train-1-0-0.train.team.svc")
    assert env[contract.ENV_ATTEMPT] == "1"
    assert env[contract.ENV_JOB_UID] == "job-uid"  # fencing tells incarnations of a name apart
    assert env[contract.ENV_FRAMEWORK] == framework  # the reference trainer picks its loop
    assert pods[0]["spec"]["nodeSelector"][labels.NODEPOOL] == "pool-1"
    assert pods[0]["spec"]["containers"][0]["resources"]["limits"][labels.TPU_RESOURCE] == "4"
    kinds = {o["kind"] for o in result.create}
    assert {"Service", "Lease", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    assert result.status.current_attempt.launched_time == at(1)


def test_killed_worker_is_a_soft_restart_in_place() -> None:
    job = job_body(status=running_status())
    pods = [
        pod(
            job,
            1,
            0,
            0,
            phase="Failed",
            exit_code=1,
            finished=12,
            message="Gloo all-reduce failed: Connection closed by peer",
        ),
        pod(job, 1, 0, 1, phase="Failed", exit_code=137, finished=10),
    ]
    result = plan(observed(job, pods), now=at(13))
    assert result.status.attempt == 2
    assert result.status.restarts.soft == 1
    assert result.status.phase is Phase.RECOVERING
    assert [p.node_pool for p in result.status.current_attempt.placement] == ["pool-0"]
    assert result.status.last_failure is not None
    assert result.status.last_failure.pod == "train-1-0-1"  # the root, not the cascade
    assert result.events[0].message.startswith("[SOFT]")
    assert result.status.current_attempt.recovering_since == at(10)


def test_shape_mismatch_fails_the_job_at_once_with_advice() -> None:
    job = job_body(status=running_status())
    message = trainer_message(contract.ExitCode.SHAPE_MISMATCH, "dot_general shapes (8,3) (4,)")
    pods = two_workers(job, phase="Failed", exit_code=21, message=message)
    result = plan(observed(job, pods), now=at(13))
    assert result.status.phase is Phase.FAILED
    assert result.status.attempt == 1
    assert result.status.restarts.total == 0
    assert result.events[0].message.startswith("[FATAL] SHAPE_MISMATCH")
    assert deleted(result) == {"train-1-0-0": 5}


def test_lost_node_is_a_hard_restart_that_marks_the_node_and_moves_the_slice() -> None:
    job = job_body(status=running_status())
    nodes = cluster(3, **{"pool-0-w1": {"ready": "Unknown", "taints": (labels.UNREACHABLE_TAINT,)}})
    result = plan(observed(job, two_workers(job), nodes=nodes), now=at(20))
    assert result.status.restarts.hard == 1
    assert [n.name for n in result.status.failed_nodes] == ["pool-0-w1"]
    assert result.status.failed_node_budget_left == 0
    assert [p.node_pool for p in result.status.current_attempt.placement] == ["pool-1"]
    assert [(m.node, m.action) for m in result.mark_nodes] == [("pool-0-w1", BadNodeAction.TAINT)]
    assert result.events[0].message.startswith("[HARD] NODE_LOST")


def test_a_second_lost_node_exceeds_the_failed_node_budget() -> None:
    job = job_body(
        status={**running_status(pools=("pool-1",)), "failedNodes": [{"name": "pool-0-w1"}]}
    )
    nodes = cluster(3, **{"pool-1-w0": {"ready": "Unknown"}})
    pods = [pod(job, 1, 0, 0, node_name="pool-1-w0"), pod(job, 1, 0, 1, node_name="pool-1-w1")]
    result = plan(observed(job, pods, nodes=nodes), now=at(20))
    assert result.status.phase is Phase.FAILED
    failed = next(c for c in result.status.conditions if c.type == "Failed")
    assert failed.reason == "FailedNodeBudgetExceeded"
    assert "maxFailedNodes=1" in (failed.message or "")


def test_unhealthy_tpu_on_a_running_node_is_hard() -> None:
    job = job_body(status=running_status())
    nodes = cluster(3, **{"pool-0-w0": {"tpu_unhealthy": True}})
    result = plan(observed(job, two_workers(job), nodes=nodes), now=at(20))
    assert result.status.restarts.hard == 1
    assert [n.name for n in result.status.failed_nodes] == ["pool-0-w0"]


def test_maintenance_restarts_gracefully_elsewhere_without_blaming_the_node() -> None:
    job = job_body(status=running_status())
    nodes = cluster(3, **{"pool-0-w0": {"taints": (labels.MAINTENANCE_TAINTS[0],)}})
    result = plan(observed(job, two_workers(job), nodes=nodes), now=at(20))
    assert result.status.failed_nodes == ()
    assert result.mark_nodes == ()
    assert [p.node_pool for p in result.status.current_attempt.placement] == ["pool-1"]
    assert set(deleted(result).values()) == {None}  # the pods' own grace period, to save


def test_medium_failure_waits_its_backoff_before_launching() -> None:
    job = job_body(status=running_status(), recovery={"backoff": {"initialSeconds": 8}})
    message = trainer_message(
        contract.ExitCode.COORDINATION_TIMEOUT, "DEADLINE_EXCEEDED: barrier timed out"
    )
    result = plan(
        observed(job, two_workers(job, phase="Failed", exit_code=31, message=message)), now=at(20)
    )
    current = result.status.current_attempt
    assert result.status.restarts.medium == 1
    assert current.not_before == at(28)
    assert current.collective_timeout_seconds == 120
    later = job_body(status=result.status.model_dump(mode="json", by_alias=True, exclude_none=True))
    waiting = plan(observed(later), now=at(25))
    assert not any(o["kind"] == "Pod" for o in waiting.create)
    assert waiting.requeue_after == pytest.approx(3.0)
    launched = plan(observed(later), now=at(29))
    pods = [o for o in launched.create if o["kind"] == "Pod"]
    env = {e["name"]: e["value"] for e in pods[0]["spec"]["containers"][0]["env"]}
    assert env[contract.ENV_COLLECTIVE_TIMEOUT] == "120"


def test_restart_budget_spent_fails_the_job_naming_the_budget() -> None:
    job = job_body(
        status={**running_status(), "restarts": {"soft": 2}}, recovery={"maxSoftRestarts": 2}
    )
    pods = two_workers(job, phase="Failed", exit_code=137)
    result = plan(observed(job, pods), now=at(20))
    assert result.status.phase is Phase.FAILED
    failed = next(c for c in result.status.conditions if c.type == "Failed")
    assert "maxSoftRestarts=2" in (failed.message or "")


def test_auto_recovery_off_diagnoses_and_fails() -> None:
    job = job_body(status=running_status(), recovery={"autoRecovery": False})
    result = plan(observed(job, two_workers(job, phase="Failed", exit_code=137)), now=at(20))
    assert result.status.phase is Phase.FAILED
    assert result.status.last_failure is not None
    assert result.status.last_failure.code == "PROCESS_KILLED"


def test_same_failure_at_the_same_step_twice_is_escalated_to_fatal() -> None:
    message = trainer_message(
        contract.ExitCode.UNKNOWN_ERROR,
        "XlaRuntimeError: INTERNAL: something odd happened",
        step=30,
    )
    first_job = job_body(status=running_status())
    first = plan(
        observed(first_job, two_workers(first_job, phase="Failed", exit_code=1, message=message)),
        now=at(20),
    )
    assert first.status.phase is Phase.RECOVERING
    second_status = first.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    second_status["currentAttempt"]["launchedTime"] = "2026-01-01T12:00:30Z"
    second_job = job_body(status=second_status)
    pods = [
        pod(second_job, 2, 0, 0),
        pod(second_job, 2, 0, 1, phase="Failed", exit_code=1, message=message),
    ]
    second = plan(observed(second_job, pods), now=at(60))
    assert second.status.phase is Phase.FAILED
    assert second.status.last_failure is not None
    assert "DETERMINISTIC_REPEAT" in (second.status.last_failure.code or "")


def test_stalled_heartbeat_while_all_run_is_a_hang() -> None:
    job = job_body(status=running_status(), recovery={"stallTimeoutSeconds": 30})
    beat = lease(renewed=10, step=40)
    healthy = plan(observed(job, two_workers(job), heartbeat=beat), now=at(35))
    assert healthy.status.attempt == 1
    hung = plan(observed(job, two_workers(job), heartbeat=beat), now=at(45))
    assert hung.status.attempt == 2
    assert hung.diagnosis is not None
    assert hung.diagnosis.code.value == "HANG"


def test_heartbeat_of_the_new_attempt_records_resumption_and_recovery_time() -> None:
    status = running_status(attempt=2)
    status["phase"] = "Recovering"
    status["currentAttempt"]["recoveringSince"] = "2026-01-01T12:00:05Z"
    job = job_body(status=status)
    pods = [pod(job, 2, 0, 0), pod(job, 2, 0, 1)]
    result = plan(observed(job, pods, heartbeat=lease(renewed=14, step=31, attempt=2)), now=at(15))
    assert result.recovery_seconds == pytest.approx(10.0)
    assert result.status.phase is Phase.RUNNING
    assert result.status.current_attempt.resumed_step == 31
    assert [e.kind for e in result.status.timeline][-1] == "Resumed"
    assert result.status.progress is not None
    assert result.status.progress.step == 31


def test_pods_of_old_attempts_are_deleted_and_forced_when_stuck_on_a_lost_node() -> None:
    job = job_body(
        status={
            **running_status(attempt=2),
            "currentAttempt": {"placement": [{"slice": 0, "nodePool": "pool-1"}]},
        }
    )
    nodes = cluster(3, **{"pool-0-w1": {"ready": "Unknown"}})
    old = [pod(job, 1, 0, 0, phase="Failed"), pod(job, 1, 0, 1, deleting=5)]
    soon = plan(observed(job, old, nodes=nodes), now=at(8))
    assert deleted(soon) == {"train-1-0-0": 0}
    assert any(o["kind"] == "Pod" for o in soon.create)  # a lost node does not block
    stuck = plan(observed(job, old, nodes=nodes), now=at(20))
    assert deleted(stuck)["train-1-0-1"] == 0
    # Still in the cache a reconcile later: forced again, told in the timeline once.
    later = job_body(status=stuck.status.model_dump(mode="json", by_alias=True, exclude_none=True))
    again = plan(observed(later, old, nodes=nodes), now=at(25))
    assert deleted(again)["train-1-0-1"] == 0
    assert [e.message for e in again.status.timeline if e.kind == "ForceDeleted"] == [
        "pod train-1-0-1 was stuck terminating on pool-0-w1"
    ]


def test_live_old_pods_on_healthy_nodes_block_the_next_attempt() -> None:
    job = job_body(
        status={
            **running_status(attempt=2),
            "currentAttempt": {"placement": [{"slice": 0, "nodePool": "pool-0"}], "graceful": True},
        }
    )
    old = [pod(job, 1, 0, 0, deleting=5), pod(job, 1, 0, 1)]
    result = plan(observed(job, old), now=at(8))
    assert not any(o["kind"] == "Pod" for o in result.create)
    assert deleted(result) == {"train-1-0-1": None}


def test_all_workers_exiting_zero_is_success() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0, phase="Succeeded"), pod(job, 1, 0, 1, phase="Succeeded")]
    result = plan(observed(job, pods), now=at(50))
    assert result.status.phase is Phase.SUCCEEDED
    assert result.status.completion_time == at(50)


def test_suspend_stops_pods_and_resume_starts_a_new_attempt_without_counting() -> None:
    job = job_body(status=running_status(), suspend=True)
    suspended = plan(observed(job, two_workers(job)), now=at(5))
    assert suspended.status.phase is Phase.SUSPENDED
    assert set(deleted(suspended)) == {"train-1-0-0", "train-1-0-1"}
    status = suspended.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    resumed = plan(observed(job_body(status=status)), now=at(9))
    assert resumed.status.attempt == 2
    assert resumed.status.restarts.total == 0


def test_two_slice_job_losing_one_slice_moves_only_that_slice() -> None:
    job = job_body(
        slices=2, status=running_status(pools=("pool-0", "pool-1")), recovery={"maxFailedNodes": 1}
    )
    nodes = cluster(3, **{"pool-1-w0": {"ready": "Unknown"}})
    pods = [pod(job, 1, s, w) for s in range(2) for w in range(2)]
    result = plan(observed(job, pods, nodes=nodes), now=at(20))
    placement = {p.slice: p.node_pool for p in result.status.current_attempt.placement}
    assert placement == {0: "pool-0", 1: "pool-2"}
    assert result.status.restarts.hard == 1


def test_finished_job_is_deleted_after_its_ttl() -> None:
    status = {**running_status(), "phase": "Succeeded", "completionTime": "2026-01-01T12:00:10Z"}
    job = job_body(status=status, ttlSecondsAfterFinished=30)
    assert not plan(observed(job), now=at(20)).delete_job
    assert plan(observed(job), now=at(41)).delete_job


def test_a_peer_lost_echo_waits_briefly_for_the_root_cause() -> None:
    job = job_body(status=running_status())
    echo = trainer_message(
        contract.ExitCode.COLLECTIVE_FAILURE, "Gloo all-reduce failed: Connection closed by peer"
    )
    pods = [
        pod(job, 1, 0, 0, phase="Failed", exit_code=30, message=echo, finished=10),
        pod(job, 1, 0, 1),
    ]
    waiting = plan(observed(job, pods), now=at(11))
    assert waiting.status.attempt == 1
    assert waiting.requeue_after == pytest.approx(2.0)
    pods[1] = pod(job, 1, 0, 1, phase="Failed", exit_code=137, finished=9.5)
    diagnosed = plan(observed(job, pods), now=at(11.5))
    assert diagnosed.status.last_failure is not None
    assert diagnosed.status.last_failure.pod == "train-1-0-1"
    assert diagnosed.status.last_failure.code == "PROCESS_KILLED"
    # When the root never shows up, the echo is diagnosed after the window.
    pods[1] = pod(job, 1, 0, 1)
    assert plan(observed(job, pods), now=at(13.5)).status.attempt == 2


@pytest.mark.parametrize(
    ("recovery", "beat", "now", "restarted"),
    [
        # Announced, no step yet: start-up has its own, longer timeout.
        ({"stallTimeoutSeconds": 30}, {"step": None, "attempt": 1}, 45, False),
        ({"stallTimeoutSeconds": 30}, {"step": None, "attempt": 1}, 61, True),
        # An earlier attempt's beat is no announcement of this one: not judged by it.
        ({"stallTimeoutSeconds": 30}, {"step": 40, "attempt": 0}, 10_000, False),
        # Stall detection off: a stale beat of this attempt is not a hang.
        ({"stallTimeoutSeconds": 0}, {"step": 40, "attempt": 1}, 10_000, False),
        ({"stallTimeoutSeconds": 30}, {"step": 40, "attempt": 1}, 40, True),
    ],
    ids=["starting", "start-up-hang", "never-announced", "stall-detection-off", "stalled"],
)
def test_a_hang_is_judged_only_by_a_heartbeat_the_attempt_announced(
    recovery: dict[str, Any], beat: dict[str, Any], now: float, restarted: bool
) -> None:
    job = job_body(status=running_status(), recovery={"startupTimeoutSeconds": 60, **recovery})
    heartbeat = lease(renewed=-5, **beat)
    result = plan(observed(job, two_workers(job), heartbeat=heartbeat), now=at(now))
    assert (result.status.attempt == 2) is restarted


def test_a_missing_pod_is_recreated_wired_like_its_attempt() -> None:
    status = {
        **running_status(attempt=2, pools=("pool-1",)),
        "failedNodes": [{"name": "pool-0-w1"}],
    }
    status["currentAttempt"]["collectiveTimeoutSeconds"] = 120
    job = job_body(status=status)
    result = plan(observed(job, [pod(job, 2, 0, 0, node_name="pool-1-w0")]), now=at(5))
    pods = [o for o in result.create if o["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == ["train-2-0-1"]
    spec = pods[0]["spec"]
    assert spec["nodeSelector"][labels.NODEPOOL] == "pool-1"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["pool-0-w1"]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"]}
    assert env[contract.ENV_COLLECTIVE_TIMEOUT] == "120"


def test_a_failure_before_the_new_attempts_first_beat_is_not_a_repeat_at_the_old_step() -> None:
    # The Lease still carries attempt 1's last step while attempt 2 restores: a failure then
    # has no step of its own and must not match attempt 1's failure at that step.
    log = trainer_message(
        contract.ExitCode.UNKNOWN_ERROR,
        "XlaRuntimeError: INTERNAL: something odd happened",
        step=None,
    )
    first_job = job_body(status=running_status(progress={"step": 30}))
    stale_beat = lease(renewed=15, step=30, attempt=1)
    first = plan(
        observed(
            first_job,
            two_workers(first_job, phase="Failed", exit_code=1, message=log),
            heartbeat=stale_beat,
        ),
        now=at(20),
    )
    assert first.status.phase is Phase.RECOVERING
    assert first.status.last_failure is not None
    second_status = first.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    second_status["currentAttempt"]["launchedTime"] = "2026-01-01T12:00:30Z"
    second_job = job_body(status=second_status)
    pods = [
        pod(second_job, 2, 0, 0),
        pod(second_job, 2, 0, 1, phase="Failed", exit_code=1, message=log),
    ]
    second = plan(observed(second_job, pods, heartbeat=stale_beat), now=at(60))
    assert second.status.phase is Phase.RECOVERING, second.status.last_failure
    assert second.status.attempt == 3


@pytest.mark.parametrize(
    ("taints", "marked", "mark_planned", "marked_after"),
    [
        ((), None, True, None),  # decided, but the mark was lost: redo it
        ((labels.BAD_NODE_TAINT,), None, False, True),  # seen marked: record it, do nothing
        ((), True, False, True),  # marked once, cleared by an admin: leave it
    ],
    ids=["mark-lost", "mark-seen", "admin-cleared"],
)
def test_a_blamed_nodes_mark_is_journaled_until_seen(
    taints: tuple[str, ...], marked: bool | None, mark_planned: bool, marked_after: bool | None
) -> None:
    failed = {"name": "pool-0-w1", "time": "2026-01-01T12:00:05Z", "code": "NODE_LOST"}
    if marked is not None:
        failed["marked"] = marked
    job = job_body(status=running_status(attempt=2, pools=("pool-1",), failedNodes=[failed]))
    nodes = cluster(**{"pool-0-w1": {"taints": taints}})
    result = plan(
        observed(
            job,
            [pod(job, 2, 0, 0, node_name="pool-1-w0"), pod(job, 2, 0, 1, node_name="pool-1-w1")],
            nodes=nodes,
        ),
        now=at(30),
    )
    assert [m.node for m in result.mark_nodes] == (["pool-0-w1"] if mark_planned else [])
    assert result.status.failed_nodes[0].marked is marked_after


def test_a_new_job_avoids_a_pool_with_host_maintenance_due_during_its_run() -> None:
    soon = str(int(at(3600).timestamp()))
    due = {"node_labels": {labels.SCHEDULED_MAINTENANCE_LABEL: soon}}
    nodes = cluster(**{"pool-0-w0": due})
    job = job_body()
    result = plan(observed(job, nodes=nodes), now=at(0))
    assert result.status.current_attempt.placement[0].node_pool == "pool-1"
    every_pool_due = cluster(**{f"pool-{p}-w0": due for p in range(3)})
    crowded = plan(observed(job_body(), nodes=every_pool_due), now=at(0))
    assert crowded.status.current_attempt.placement[0].node_pool == "pool-0"
    notes = [e.message for e in crowded.status.timeline if e.kind == "Placement"]
    assert notes and "maintenance" in notes[0]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (contract.HEARTBEAT_STEP, "-5"),
        (contract.HEARTBEAT_STEP, "1" + "0" * 30),
        (contract.HEARTBEAT_STEP, "seven"),
        (contract.HEARTBEAT_STEPS_PER_SECOND, "nan"),
        (contract.HEARTBEAT_STEPS_PER_SECOND, "inf"),
        (contract.HEARTBEAT_STEPS_PER_SECOND, "-2"),
        (contract.HEARTBEAT_CHECKPOINT_STEP, "-1"),
        (contract.HEARTBEAT_ATTEMPT, "0"),
        (contract.HEARTBEAT_TOTAL_STEPS, "0"),
    ],
    ids=str,
)
def test_a_heartbeat_number_out_of_range_is_absent_evidence_not_a_crash(
    key: str, value: str
) -> None:
    job = job_body(status=running_status())
    beat = lease(renewed=10, step=40)
    beat["metadata"]["annotations"][key] = value
    result = plan(observed(job, two_workers(job), heartbeat=beat), now=at(12))
    status = result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    from tpujob.api import parse_status

    assert parse_status(status) == result.status  # what the API would accept back
    seen = observed(job, two_workers(job), heartbeat=beat).heartbeat
    assert seen is not None
    fields = {
        contract.HEARTBEAT_STEP: seen.step,
        contract.HEARTBEAT_ATTEMPT: seen.attempt,
        contract.HEARTBEAT_STEPS_PER_SECOND: seen.steps_per_second,
        contract.HEARTBEAT_CHECKPOINT_STEP: seen.checkpoint_step,
        contract.HEARTBEAT_TOTAL_STEPS: seen.total_steps,
    }
    assert fields[key] is None


def test_a_save_broken_by_a_killed_peer_blames_the_killed_peer() -> None:
    # Worker 1 is killed while the gang saves: worker 0's save fails in its collective, and
    # the trainer reports the save; the root is still the kill.
    save = trainer_message(
        contract.ExitCode.CHECKPOINT_SAVE_FAILED,
        "saving step 20 failed: ValueError: UNKNOWN: Gloo AllGather failed: "
        "Read error [10.1.1.4]:6380: Connection reset by peer",
        step=20,
    )
    job = job_body(status=running_status())
    pods = [
        pod(job, 1, 0, 0, phase="Failed", exit_code=41, message=save, finished=9.0),
        pod(job, 1, 0, 1, phase="Failed", exit_code=137, reason="Error", finished=10.0),
    ]
    result = plan(observed(job, pods), now=at(20))
    assert result.diagnosis is not None
    assert result.diagnosis.root_worker == 1
    assert result.status.restarts.soft == 1, result.status.last_failure


def test_a_hang_at_start_up_is_not_stamped_with_the_previous_attempts_step() -> None:
    # Attempt 2 announced itself over attempt 1's beat; the hang that follows has no step of
    # its own, so a second one is not "the same failure at the same step".
    job = job_body(
        status=running_status(attempt=2),
        recovery={"stallTimeoutSeconds": 10, "startupTimeoutSeconds": 60},
    )
    old_beat = lease(renewed=-100, step=None, attempt=2)
    pods = [pod(job, 2, 0, 0), pod(job, 2, 0, 1)]
    assert plan(observed(job, pods, heartbeat=old_beat), now=at(50)).diagnosis is None
    hung = plan(observed(job, pods, heartbeat=old_beat), now=at(70))
    assert hung.diagnosis is not None
    assert hung.diagnosis.code.value == "HANG"
    assert hung.diagnosis.step is None


@pytest.mark.parametrize(("grace", "forced_at"), [(None, 42), (300, 312)])
def test_a_pod_terminating_on_a_healthy_node_is_given_its_whole_grace_before_it_is_forced(
    grace: int | None, forced_at: float
) -> None:
    """The trainer's `terminationGracePeriodSeconds` (30 by default) is its time to save on
    SIGTERM: a pod still terminating is forced only once that and the operator's
    --force-delete-after (10 s here) have passed since its deletion (at 1 s)."""
    trainer = {"image": "trainer:1", "command": ["tpujob-trainer"]}
    if grace is not None:
        trainer["terminationGracePeriodSeconds"] = grace
    job = job_body(
        status={
            **running_status(attempt=2),
            "currentAttempt": {"placement": [{"slice": 0, "nodePool": "pool-1"}]},
        },
        trainer=trainer,
    )
    old = [pod(job, 1, 0, 0, deleting=1)]
    manifest = trainer_pod(parse_job(job), AttemptSettings(attempt=2, pools={0: "pool-1"}), 0, 0)
    assert manifest["spec"]["terminationGracePeriodSeconds"] == (grace or 30)
    assert "train-1-0-0" not in deleted(plan(observed(job, old), now=at(forced_at - 3)))
    assert deleted(plan(observed(job, old), now=at(forced_at)))["train-1-0-0"] == 0
