"""The node ledger in the planner: another tenant's recent soft blame of the same node makes
this soft failure hard (node tainted, slice moved); nothing a single tenant controls does."""

from __future__ import annotations

from dataclasses import replace

import pytest
from tests.unit.builders import at, job_body, observed, pod, running_status

from tpujob import diagnosis as dx
from tpujob.api import Phase
from tpujob.plan.node_ledger import weigh_ledger
from tpujob.plan.planner import plan
from tpujob.plan.result import Plan

NOW = 20.0
DAY = 24 * 3600.0


def killed_on(node: str, blames: tuple[tuple[str, str, float], ...]) -> Plan:
    job = job_body(status=running_status())
    pods = [
        pod(job, 1, 0, 0, node_name="pool-0-w0"),
        pod(job, 1, 0, 1, phase="Failed", exit_code=1, node_name=node),
    ]
    # Read by the operator from the log, a host-level mechanism: the node's TPU held by a
    # foreign process (the trainer's own word would not be trusted as the node's evidence).
    logs = {"train-1-0-1": "RuntimeError: open(/dev/accel0): Device or resource busy"}
    return plan(replace(observed(job, pods, logs=logs), node_blames=blames), now=at(NOW))


@pytest.mark.parametrize(
    ("blamed_by", "age", "hard"),
    [
        ("other-team/train", 60.0, True),
        ("team/another-job", 60.0, False),  # the same tenant cannot taint a node by itself
        ("other-team/train", 2 * DAY, False),  # outside the window
        (None, 0.0, False),
    ],
    ids=["other-tenant-recently", "same-tenant", "long-ago", "first-blame"],
)
def test_a_soft_failure_on_a_node_another_tenant_blamed_lately_is_hard(
    blamed_by: str | None, age: float, hard: bool
) -> None:
    blames = (("pool-0-w1", blamed_by, at(NOW).timestamp() - age),) if blamed_by else ()
    result = killed_on("pool-0-w1", blames)
    assert result.diagnosis is not None
    assert result.ledger_blame is not None
    assert (result.ledger_blame.node, result.ledger_blame.job) == ("pool-0-w1", "team/train")
    if hard:
        assert result.diagnosis.failure_class is dx.FailureClass.HARD
        assert [n.name for n in result.status.failed_nodes] == ["pool-0-w1"]
        assert [m.node for m in result.mark_nodes] == ["pool-0-w1"]  # across tenants: marked
        assert not result.status.failed_nodes[0].job_only
        assert result.status.current_attempt.placement[0].node_pool != "pool-0"
        assert "different namespaces" in result.diagnosis.summary
    else:
        assert result.diagnosis.failure_class is dx.FailureClass.SOFT
        assert result.status.failed_nodes == ()
        assert result.status.phase is Phase.RECOVERING


def soft(evidence: tuple[dx.Evidence, ...]) -> dx.Diagnosis:
    return dx.Diagnosis(
        failure_class=dx.FailureClass.SOFT,
        code=dx.FailureCode.DEVICE_BUSY,
        summary="TPU busy",
        confidence=dx.Confidence.HIGH,
        rule="test",
        evidence=evidence,
    )


@pytest.mark.parametrize(
    ("diagnosis", "node", "counted"),
    [
        (soft((dx.Evidence(dx.Source.EXIT, "exit 137"),)), "n1", True),
        (soft((dx.Evidence(dx.Source.USER_RULE, "rule 0"),)), "n1", False),
        (soft(()), None, False),
        (replace(soft(()), failure_class=dx.FailureClass.MEDIUM), "n1", False),
        (replace(soft(()), code=dx.FailureCode.PROCESS_KILLED), "n1", False),
        (replace(soft(()), code=dx.FailureCode.PREEMPTED), "n1", False),
        (replace(soft(()), code=dx.FailureCode.STORAGE_UNAVAILABLE), "n1", False),
        (replace(soft(()), code=dx.FailureCode.COLLECTIVE_FAILURE), "n1", False),
        (replace(soft(()), code=dx.FailureCode.FENCED), "n1", False),
        (replace(soft(()), code=dx.FailureCode.HANG), "n1", False),
        (replace(soft(()), probability=0.7), "n1", False),
        (replace(soft(()), code=dx.FailureCode.RUNTIME_SESSION_LOST), "n1", True),
    ],
    ids=[
        "operator-evidence",
        "user-rule",
        "no-node",
        "not-soft",
        "killed-from-outside",
        "preempted",
        "storage-503",
        "peer-lost",
        "fenced",
        "hang",
        "model-guess",
        "tpu-runtime-lost",
    ],
)
def test_only_soft_failures_the_operator_read_itself_enter_the_ledger(
    diagnosis: dx.Diagnosis, node: str | None, counted: bool
) -> None:
    outcome = weigh_ledger(
        diagnosis,
        node=node,
        namespace="team",
        name="train",
        blames=(("n1", "other/x", at(NOW).timestamp()),),
        now=at(NOW),
    )
    assert (outcome.blame is not None) is counted
    assert (outcome.blamed_node == "n1") is counted
