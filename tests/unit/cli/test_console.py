"""`tpujob describe` shows what a person needs after a failure, from the status alone."""

from __future__ import annotations

import pytest
from tests.unit.builders import at, job_body, lease, observed, pod, running_status

from tpujob.api import parse_job
from tpujob.console import describe_lines, false_conditions, job_row
from tpujob.plan.planner import plan


def failed_over_node_loss() -> dict[str, object]:
    from tests.unit.builders import cluster

    job = job_body(status=running_status())
    nodes = cluster(3, **{"pool-0-w1": {"ready": "Unknown"}})
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    result = plan(
        observed(job, pods, nodes=nodes, heartbeat=lease(renewed=19, step=42)), now=at(20)
    )
    return job_body(status=result.status.model_dump(mode="json", by_alias=True, exclude_none=True))


def test_describe_shows_the_failure_chain_budget_and_timeline() -> None:
    text = "\n".join(describe_lines(parse_job(failed_over_node_loss()), at(30)))
    assert "NODE_LOST" in text
    assert "[HARD] NODE_LOST" in text
    assert "pool-0-w1 (budget left 0)" in text
    assert "FailureSeen" in text and "Restarting" in text
    assert "step 42/" in text


def test_get_row_has_phase_step_restarts_for_scripts() -> None:
    row = job_row(parse_job(failed_over_node_loss()))
    assert row["phase"] == "Recovering"
    assert row["restarts"]["hard"] == 1
    assert row["failedNodes"] == ["pool-0-w1"]


def test_describe_breaks_the_wall_time_down_by_goodput_category() -> None:
    body = failed_over_node_loss()
    text = "\n".join(describe_lines(parse_job(body), at(30)))
    # The attempt never reported its first heartbeat here: all of its 20 s were start-up.
    assert "wall time  start-up 20s (100%)" in text
    status = parse_job(body).status
    assert status.goodput_breakdown is not None
    assert status.attempt_history and status.attempt_history[0].failed


def test_the_loss_the_trainer_reports_reaches_the_status_and_describe() -> None:
    from tpujob.api import contract

    job = job_body(status=running_status())
    beat = lease(renewed=19, step=42)
    beat["metadata"]["annotations"][contract.HEARTBEAT_LOSS] = "0.8125"
    result = plan(observed(job, [pod(job, 1, 0, 0), pod(job, 1, 0, 1)], heartbeat=beat), now=at(20))
    assert result.status.progress is not None and result.status.progress.loss == 0.8125
    body = job_body(status=result.status.model_dump(mode="json", by_alias=True, exclude_none=True))
    assert "loss 0.8125" in "\n".join(describe_lines(parse_job(body), at(30)))


def test_describe_shows_why_a_job_waits_for_a_node_pool() -> None:
    from tests.unit.builders import T0, cluster

    waiting = plan(
        observed(job_body(), nodes=cluster(1, **{"pool-0-w1": {"ready": "Unknown"}})), now=T0
    )
    body = job_body(status=waiting.status.model_dump(mode="json", by_alias=True, exclude_none=True))
    lines = describe_lines(parse_job(body), at(30))
    assert "[bold]conditions False[/bold]" in lines
    said = [line.split(maxsplit=1) for line in lines if line.startswith("  Running ")]
    assert said == [
        ["Running", "WaitingForPool: 1 of 1 slices have no free tpu-v4-podslice 2x2x2 pool"]
    ]


@pytest.mark.parametrize(
    ("conditions", "shown"),
    [
        ([], []),
        ([("SpecValid", "True", "Valid", None)], []),
        ([("PodsRefused", "Unknown", None, None)], []),
        (
            [("Running", "False", "Recovering", "restarting"), ("Suspended", "False", None, None)],
            ["  Running    Recovering: restarting", "  Suspended  -"],
        ),
    ],
    ids=["none", "true", "unknown", "false-with-and-without-reason"],
)
def test_describe_lists_exactly_the_false_conditions(
    conditions: list[tuple[str, str, str | None, str | None]], shown: list[str]
) -> None:
    status = {
        "conditions": [
            {"type": t, "status": s} | ({"reason": r} if r else {}) | ({"message": m} if m else {})
            for t, s, r, m in conditions
        ]
    }
    lines = false_conditions(parse_job(job_body(status=status)))
    assert lines == (["[bold]conditions False[/bold]", *shown] if shown else [])


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        (
            {"name": "team-queue", "waitingSince": "2026-01-01T12:00:00Z"},
            "queue      team-queue: waiting for admission for 30s",
        ),
        (
            {
                "name": "team-queue",
                "admitted": True,
                "clusterQueue": "team-cq",
                "evictions": 1,
                "lastEviction": "evicted by Kueue (Preempted)",
                "queuedSeconds": 12,
            },
            "queue      team-queue: admitted by ClusterQueue team-cq; evicted 1x, last: "
            "evicted by Kueue (Preempted); queued 12s after its start",
        ),
    ],
    ids=["waiting", "admitted-after-a-preemption"],
)
def test_describe_shows_a_queued_jobs_admission_and_preemptions(
    queue: dict[str, object], expected: str
) -> None:
    body = job_body(status={**running_status(), "queue": queue})
    assert expected in "\n".join(describe_lines(parse_job(body), at(30)))


def test_describe_says_an_elastic_job_runs_on_fewer_slices_and_for_how_long() -> None:
    from tests.unit.builders import cluster

    status = running_status(pools=("pool-0",))
    status["currentAttempt"].update({"slices": 1, "resizable": True})
    body = job_body(slices=2, status=status, elastic={"minSlices": 1})
    # Only the pool it runs on exists: it cannot grow back.
    pods = [pod(body, 1, 0, w) for w in range(2)]
    result = plan(observed(body, pods, nodes=cluster(1)), now=at(90))
    written = result.status.model_dump(mode="json", by_alias=True, exclude_none=True)
    text = "\n".join(describe_lines(parse_job({**body, "status": written}), at(90)))
    assert "x2 (4 hosts), elastic down to 1; [yellow]on 1 of 2 slices now[/yellow]" in text
    assert "degraded   90s on fewer slices than asked for" in text
