"""Slice restarts: a failure of some slices replaces their pods only; the others rejoin."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import (
    at,
    cluster,
    iso,
    job_body,
    lease,
    observed,
    pod,
    reported,
    running_status,
)

from tpujob.api import contract, labels
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan, PlannerSettings

TWO_SLICES = ("pool-0", "pool-1")


def beat(*, rejoins: bool = True, attempt: int = 1) -> dict[str, Any]:
    body = lease(renewed=9, step=30, attempt=attempt)
    body["metadata"]["annotations"][contract.HEARTBEAT_REJOINS] = "true" if rejoins else "false"
    return body


def gang(job: dict[str, Any], attempt: int = 1, **faults: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod of a two-slice job; `faults` maps "s-w" to pod() keyword args."""
    return [
        pod(job, attempt, s, w, **faults.get(f"{s}-{w}", {})) for s in range(2) for w in range(2)
    ]


def killed(finished: float = 10) -> dict[str, Any]:
    return {"phase": "Failed", "exit_code": 137, "finished": finished}


def deleted(result: Plan) -> list[str]:
    return sorted(d.name for d in result.delete_pods)


def kept(result: Plan) -> list[tuple[int, int]]:
    return [(k.slice, k.pods_attempt) for k in result.status.current_attempt.kept_slices]


@pytest.mark.parametrize(
    ("case", "faults", "body", "settings", "want_kept", "want_deleted"),
    [
        (
            "a worker of slice 1 killed",
            {"1-0": killed()},
            beat(),
            PlannerSettings(),
            [(0, 1)],
            ["train-1-1-1"],
        ),
        (
            "a worker of slice 0 killed: the coordinator's slice is not replaced under kept ones",
            {"0-1": killed()},
            beat(),
            PlannerSettings(),
            [],
            ["train-1-0-0", "train-1-1-0", "train-1-1-1"],
        ),
        (
            "trainers that cannot rejoin",
            {"1-0": killed()},
            beat(rejoins=False),
            PlannerSettings(),
            [],
            ["train-1-0-0", "train-1-0-1", "train-1-1-1"],
        ),
        (
            "no heartbeat yet",
            {"1-0": killed()},
            None,
            PlannerSettings(),
            [],
            ["train-1-0-0", "train-1-0-1", "train-1-1-1"],
        ),
        (
            "slice restarts turned off",
            {"1-0": killed()},
            beat(),
            PlannerSettings(slice_restarts=False),
            [],
            ["train-1-0-0", "train-1-0-1", "train-1-1-1"],
        ),
        (
            "a medium failure (the timeout changes)",
            {"1-0": {"phase": "Failed", "exit_code": 31, "finished": 10}},
            beat(),
            PlannerSettings(),
            [],
            ["train-1-0-0", "train-1-0-1", "train-1-1-1"],
        ),
        (
            "both slices failed",
            {"0-0": killed(), "1-0": killed(11)},
            beat(),
            PlannerSettings(),
            [],
            ["train-1-0-1", "train-1-1-1"],
        ),
        (
            "the other slice's pod is being deleted",
            {"1-0": killed(), "0-1": {"deleting": 5}},
            beat(),
            PlannerSettings(),
            [],
            ["train-1-0-0", "train-1-1-1"],
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_failure_of_one_slice_keeps_the_healthy_slices_when_their_trainers_can_rejoin(
    case: str,
    faults: dict[str, dict[str, Any]],
    body: dict[str, Any] | None,
    *,
    settings: PlannerSettings,
    want_kept: list[tuple[int, int]],
    want_deleted: list[str],
) -> None:
    job = job_body(slices=2, status=running_status(pools=TWO_SLICES))
    result = plan(observed(job, gang(job, **faults), heartbeat=body), now=at(13), settings=settings)
    assert result.status.attempt == 2, case
    assert kept(result) == want_kept
    assert deleted(result) == want_deleted


def test_a_lost_node_moves_its_slice_and_keeps_the_other() -> None:
    job = job_body(slices=2, status=running_status(pools=TWO_SLICES))
    nodes = cluster(3, **{"pool-1-w1": {"ready": "Unknown", "taints": (labels.UNREACHABLE_TAINT,)}})
    result = plan(observed(job, gang(job), nodes=nodes, heartbeat=beat()), now=at(20))
    assert result.status.restarts.hard == 1
    assert kept(result) == [(0, 1)]
    assert deleted(result) == ["train-1-1-0", "train-1-1-1"]
    placement = {p.slice: p.node_pool for p in result.status.current_attempt.placement}
    assert placement == {0: "pool-0", 1: "pool-2"}
    assert "slice 0 kept in place" in (result.status.last_failure.action or "")  # type: ignore[union-attr]


def restarted(kept_slice: int, *, launched: bool = False, **extra: Any) -> dict[str, Any]:
    """Attempt 2 after slice `1 - kept_slice` failed: slice `kept_slice` kept from attempt 1."""
    current: dict[str, Any] = {
        "placement": [{"slice": 0, "nodePool": "pool-0"}, {"slice": 1, "nodePool": "pool-1"}],
        "keptSlices": [{"slice": kept_slice, "podsAttempt": 1}],
    }
    if launched:
        current["launchedTime"] = iso(at(14))
    return {
        "phase": "Recovering",
        "attempt": 2,
        "startTime": iso(at(0)),
        "restarts": {"soft": 1, "total": 1},
        "currentAttempt": current,
        **extra,
    }


def env_of(manifest: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in manifest["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize(
    ("kept_slice", "coordinator"),
    [
        (0, "train-1-0-0.train.team.svc.cluster.local"),
        (1, "train-2-0-0.train.team.svc.cluster.local"),
    ],
)
def test_kept_pods_rejoin_after_the_fence_and_only_the_failed_slice_gets_new_pods(
    kept_slice: int, coordinator: str
) -> None:
    job = job_body(slices=2, status=restarted(kept_slice))
    pods = [pod(job, 1, kept_slice, w) for w in range(2)]
    result = plan(observed(job, pods, heartbeat=beat()), now=at(14))
    assert result.fence_attempt == 2
    assert sorted(r.name for r in result.rejoin_pods) == [
        f"train-1-{kept_slice}-{w}" for w in range(2)
    ]
    order = contract.parse_rejoin(result.rejoin_pods[0].order)
    assert order == contract.Rejoin(attempt=2, coordinator=coordinator)
    new = [o for o in result.create if o["kind"] == "Pod"]
    replaced = 1 - kept_slice
    assert [p["metadata"]["name"] for p in new] == [f"train-2-{replaced}-{w}" for w in range(2)]
    env = env_of(new[0])
    assert env["JAX_COORDINATOR_ADDRESS"].startswith(coordinator + ":")
    assert env[contract.ENV_ATTEMPT] == "2"
    assert result.delete_pods == ()
    assert result.status.current_attempt.launched_time == at(14)


def test_kept_pods_rejoin_while_the_replaced_slices_old_pods_still_terminate() -> None:
    job = job_body(slices=2, status=restarted(0))
    pods = [pod(job, 1, 0, w) for w in range(2)] + [pod(job, 1, 1, 1, deleting=12)]
    result = plan(observed(job, pods, heartbeat=beat()), now=at(14))
    assert sorted(r.name for r in result.rejoin_pods) == ["train-1-0-0", "train-1-0-1"]
    assert result.fence_attempt == 2
    assert not [o for o in result.create if o["kind"] == "Pod"]  # the new pods wait for them
    assert result.status.current_attempt.launched_time is None


def rejoined(job: dict[str, Any], slice_index: int, worker: int, **kwargs: Any) -> dict[str, Any]:
    """A pod of attempt 1 told to rejoin attempt 2 (its label moved, its name kept)."""
    manifest = pod(job, 1, slice_index, worker, **kwargs)
    manifest["metadata"]["labels"][labels.ATTEMPT] = "2"
    return manifest


def test_once_launched_kept_pods_count_as_the_attempts_own_and_are_not_told_again() -> None:
    job = job_body(slices=2, status=restarted(0, launched=True))
    pods = [rejoined(job, 0, 0), rejoined(job, 0, 1), pod(job, 2, 1, 0), pod(job, 2, 1, 1)]
    result = plan(observed(job, pods, heartbeat=beat(attempt=2)), now=at(20))
    assert result.rejoin_pods == ()
    assert result.create == ()
    assert result.delete_pods == ()
    assert result.status.phase.value == "Running"


def test_a_slice_kept_twice_keeps_the_names_of_the_attempt_that_made_its_pods() -> None:
    job = job_body(slices=2, status=restarted(0, launched=True))
    pods = [
        rejoined(job, 0, 0),
        rejoined(job, 0, 1),
        pod(job, 2, 1, 0),
        pod(job, 2, 1, 1, phase="Failed", exit_code=137),
    ]
    result = plan(observed(job, pods, heartbeat=beat(attempt=2)), now=at(20))
    assert result.status.attempt == 3
    assert result.status.last_failure is not None
    assert result.status.last_failure.pod == "train-2-1-1"
    assert kept(result) == [(0, 1)]
    assert deleted(result) == ["train-2-1-0"]


def test_a_kept_pod_that_rejoined_and_then_failed_is_the_new_attempts_failure() -> None:
    job = job_body(slices=2, status=restarted(0, launched=True))
    pods = [
        rejoined(job, 0, 0),
        rejoined(job, 0, 1, phase="Failed", exit_code=137),
        pod(job, 2, 1, 0),
        pod(job, 2, 1, 1),
    ]
    result = plan(observed(job, pods, heartbeat=beat(attempt=2)), now=at(20))
    assert result.status.attempt == 3
    assert result.status.last_failure is not None
    assert result.status.last_failure.pod == "train-1-0-1"
    assert kept(result) == []  # slice 0, the coordinator's, is replaced: so is every pod


def test_a_kept_pod_that_ended_before_it_was_told_makes_the_attempt_replace_every_pod() -> None:
    job = job_body(slices=2, status=restarted(0))
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=137)]
    result = plan(observed(job, pods, heartbeat=beat()), now=at(14))
    assert kept(result) == []
    assert result.rejoin_pods == ()
    assert deleted(result) == ["train-1-0-0", "train-1-0-1"]
    assert not [o for o in result.create if o["kind"] == "Pod"]  # they go first
    assert any(e.kind == "SliceRestartAbandoned" for e in result.status.timeline)


def test_a_kept_pod_told_by_an_operator_that_then_restarted_is_told_again_after_launch() -> None:
    job = job_body(slices=2, status=restarted(0, launched=True))
    pods = [rejoined(job, 0, 0), pod(job, 1, 0, 1), pod(job, 2, 1, 0), pod(job, 2, 1, 1)]
    result = plan(observed(job, pods, heartbeat=beat(attempt=2)), now=at(20))
    assert [r.name for r in result.rejoin_pods] == ["train-1-0-1"]
    assert result.fence_attempt == 2
    assert not [o for o in result.create if o["kind"] == "Pod"]
    assert result.delete_pods == ()


def hung_job(slices: int, *, status: dict[str, Any] | None = None) -> dict[str, Any]:
    pools = TWO_SLICES[:slices]
    return job_body(
        slices=slices,
        status=status or running_status(pools=pools),
        recovery={"stallTimeoutSeconds": 20},
    )


@pytest.mark.parametrize(
    ("slices", "rejoins", "settings", "want_kept", "want_deleted"),
    [
        (1, True, PlannerSettings(), [(0, 1)], []),
        (2, True, PlannerSettings(), [(0, 1), (1, 1)], []),
        (1, False, PlannerSettings(), [], ["train-1-0-0", "train-1-0-1"]),
        (1, True, PlannerSettings(slice_restarts=False), [], ["train-1-0-0", "train-1-0-1"]),
    ],
    ids=["one-slice", "two-slices", "trainers-that-cannot-rejoin", "restarts-in-place-off"],
)
def test_a_hang_restarts_every_trainer_in_its_pod(
    slices: int,
    rejoins: bool,
    settings: PlannerSettings,
    want_kept: list[tuple[int, int]],
    want_deleted: list[str],
) -> None:
    job = hung_job(slices)
    pods = [pod(job, 1, s, w) for s in range(slices) for w in range(2)]
    result = plan(
        observed(job, pods, heartbeat=beat(rejoins=rejoins)), now=at(40), settings=settings
    )
    assert result.status.last_failure is not None
    assert result.status.last_failure.code == "HANG"
    assert (result.status.attempt, result.status.restarts.soft) == (2, 1)
    assert kept(result) == want_kept
    assert deleted(result) == want_deleted
    in_place = "every trainer restarted in its pod" in (result.status.last_failure.action or "")
    assert in_place is bool(want_kept)


def test_a_hang_of_an_attempt_restarted_whole_in_place_replaces_every_pod() -> None:
    status = restarted(0, launched=True)
    status["phase"] = "Running"
    status["currentAttempt"]["keptSlices"] = [{"slice": 0, "podsAttempt": 1}]
    status["currentAttempt"]["placement"] = [{"slice": 0, "nodePool": "pool-0"}]
    job = hung_job(1, status=status)
    pods = [rejoined(job, 0, 0), rejoined(job, 0, 1)]
    result = plan(observed(job, pods, heartbeat=beat(attempt=2)), now=at(40))
    assert result.status.attempt == 3
    assert kept(result) == []
    assert deleted(result) == ["train-1-0-0", "train-1-0-1"]


def test_a_worker_killed_in_a_one_slice_job_replaces_every_pod() -> None:
    job = hung_job(1)
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, **killed())]
    result = plan(observed(job, pods, heartbeat=beat()), now=at(13))
    assert result.status.attempt == 2
    assert kept(result) == []
    assert deleted(result) == ["train-1-0-0"]


def test_a_job_kept_whole_starts_its_next_attempt_with_no_new_pod() -> None:
    status = restarted(0)
    status["currentAttempt"]["placement"] = [{"slice": 0, "nodePool": "pool-0"}]
    job = hung_job(1, status=status)
    pods = [pod(job, 1, 0, w) for w in range(2)]
    result = plan(observed(job, pods, heartbeat=beat()), now=at(41))
    assert result.fence_attempt == 2
    assert sorted(r.name for r in result.rejoin_pods) == ["train-1-0-0", "train-1-0-1"]
    order = contract.parse_rejoin(result.rejoin_pods[0].order)
    assert order == contract.Rejoin(
        attempt=2, coordinator="train-1-0-0.train.team.svc.cluster.local"
    )
    assert not [o for o in result.create if o["kind"] == "Pod"]
    assert result.delete_pods == ()
    assert result.status.current_attempt.launched_time == at(41)


SIGKILL_EXIT = 137
PEER_LOST_EXIT = int(contract.ExitCode.COLLECTIVE_FAILURE)


@pytest.mark.parametrize(
    ("slices", "reports", "now", "want_kept", "want_deleted"),
    [
        ("one slice, worker 1 killed", {(0, 1): SIGKILL_EXIT}, 12, [(0, 1)], []),
        (
            "one slice, the peer's echo came first",
            {(0, 0): PEER_LOST_EXIT, (0, 1): SIGKILL_EXIT},
            12,
            [(0, 1)],
            [],
        ),
        ("two slices, a worker of slice 1", {(1, 0): SIGKILL_EXIT}, 12, [(0, 1), (1, 1)], []),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_reported_soft_failure_restarts_every_trainer_in_its_pod(
    slices: str,
    reports: dict[tuple[int, int], int],
    now: float,
    want_kept: list[tuple[int, int]],
    want_deleted: list[str],
) -> None:
    count = 2 if "two" in slices else 1
    job = hung_job(count)
    pods = [pod(job, 1, s, w) for s in range(count) for w in range(2)]
    body = beat()
    for (s, w), code in reports.items():
        reported(body, s, w, exit_code=code, at_seconds=10)
    result = plan(observed(job, pods, heartbeat=body), now=at(now))
    assert result.status.attempt == 2 and result.status.restarts.soft == 1
    assert kept(result) == want_kept
    assert deleted(result) == want_deleted
    assert result.status.last_failure is not None
    assert "every trainer restarted in its pod" in (result.status.last_failure.action or "")


@pytest.mark.parametrize(
    ("case", "report", "want_deleted"),
    [
        ("a deterministic error", {"exit_code": int(contract.ExitCode.SHAPE_MISMATCH)}, None),
        ("a report of another job", {"job_uid": "someone-else"}, ()),
        ("a report of another attempt", {"attempt": 2}, ()),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_a_reported_failure_that_is_not_soft_or_not_this_attempts_is_not_restarted_in_place(
    case: str, report: dict[str, Any], want_deleted: tuple[str, ...] | None
) -> None:
    job = hung_job(1)
    pods = [pod(job, 1, 0, w) for w in range(2)]
    body = reported(beat(), 0, 1, at_seconds=10, **{"exit_code": SIGKILL_EXIT, **report})
    result = plan(observed(job, pods, heartbeat=body), now=at(12))
    if want_deleted == ():
        assert result.status.attempt == 1 and result.status.last_failure is None
        return
    assert result.status.phase == "Failed"
    assert kept(result) == []


def test_a_reported_failure_on_a_node_lost_meanwhile_replaces_the_pods() -> None:
    job = hung_job(1)
    pods = [pod(job, 1, 0, w) for w in range(2)]
    gone = [n for n in cluster() if n["metadata"]["name"] != "pool-0-w1"]
    body = reported(beat(), 0, 1, at_seconds=10)
    result = plan(observed(job, pods, nodes=gone, heartbeat=body), now=at(200))
    assert result.status.attempt == 2
    assert kept(result) == []


def test_a_lost_peer_reported_alone_waits_for_the_root_then_counts() -> None:
    job = hung_job(1)
    pods = [pod(job, 1, 0, w) for w in range(2)]
    body = reported(beat(), 0, 0, exit_code=PEER_LOST_EXIT, at_seconds=10)
    early = plan(observed(job, pods, heartbeat=body), now=at(15))
    assert early.status.attempt == 1 and early.status.last_failure is None
    late = plan(observed(job, pods, heartbeat=body), now=at(25))
    assert late.status.attempt == 2
    assert late.status.last_failure is not None
    assert late.status.last_failure.pod == "train-1-0-0"
