"""The watch-fed cache: what each index keeps of an object, and the reads built on it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from tests.unit.builders import (
    at,
    job_body,
    lease,
    lease_owner,
    node,
    pod,
    running_status,
    trainer_message,
)
from tests.unit.fakes import FakeReader

from tpujob.api import contract, labels
from tpujob.kube.cache import (
    CachedView,
    NodeBook,
    job_record,
    lease_record,
    newer,
    node_record,
    pod_by_node,
    pod_by_pool,
    pod_record,
)
from tpujob.kube.observe import bounded_tail, observe, tails_to_read
from tpujob.observed.nodes import note_tpu_shortfall
from tpujob.observed.views import MAX_HEALTH_CHARS, heartbeat_view, node_view


def test_a_pods_record_keeps_its_owner_uids_and_a_redacted_message() -> None:
    job = job_body(status=running_status())
    message = trainer_message(
        contract.ExitCode.SHAPE_MISMATCH, "fetch https://user:hunter2@example.com/data failed"
    )
    raw = pod(job, 1, 0, 1, phase="Failed", exit_code=1, message=message)
    record = pod_record(raw)
    assert record.owners == frozenset({job["metadata"]["uid"]})
    assert "hunter2" not in record.view.message
    assert record.view.exit_code == 1


@pytest.mark.parametrize(
    ("phase", "held"),
    [("Pending", True), ("Running", True), ("Succeeded", False), ("Failed", False)],
)
def test_only_a_live_pod_holds_its_pool(phase: str, held: bool) -> None:
    job = job_body(status=running_status())
    raw = pod(job, 1, 0, 0, phase=phase)
    raw["spec"]["nodeSelector"] = {labels.NODEPOOL: "pool-a"}
    assert bool(pod_by_pool(raw)) is held


@pytest.mark.parametrize(
    ("resources", "held"),
    [
        ({"limits": {labels.TPU_RESOURCE: "4"}}, True),
        ({"requests": {labels.TPU_RESOURCE: "1"}}, True),
        ({"limits": {labels.TPU_RESOURCE: "0"}}, False),
        ({"requests": {"cpu": "1"}}, False),
        ({}, False),
    ],
)
def test_a_pod_that_asks_for_no_tpu_holds_no_pool_whatever_its_labels(
    resources: dict[str, dict[str, str]], held: bool
) -> None:
    # A tenant's squatting pod: a job's label, a pool's selector, Pending, and no chips.
    job = job_body(status=running_status())
    raw = pod(job, 1, 0, 0, phase="Pending")
    raw["spec"]["nodeSelector"] = {labels.NODEPOOL: "pool-a"}
    raw["spec"]["containers"][0]["resources"] = resources
    assert bool(pod_by_pool(raw)) is held


def test_a_pod_is_indexed_under_the_node_it_is_bound_to() -> None:
    job = job_body(status=running_status())
    raw = pod(job, 1, 0, 0, node_name="node-7")
    assert pod_by_node(raw) == {"node-7": ("team", "train")}
    unbound = pod(job, 1, 0, 1)
    unbound["spec"].pop("nodeName", None)
    assert pod_by_node(unbound) == {}


def test_busy_pools_are_those_other_jobs_hold() -> None:
    job = job_body(status=running_status())
    other = job_body(status=running_status())
    other["metadata"].update(name="other", uid="uid-other")
    mine, theirs = pod(job, 1, 0, 0), pod(other, 1, 0, 0)
    theirs["metadata"]["labels"][labels.JOB] = "other"
    mine["spec"]["nodeSelector"] = {labels.NODEPOOL: "pool-a"}
    theirs["spec"]["nodeSelector"] = {labels.NODEPOOL: "pool-b"}
    view = FakeReader([mine, theirs], body=job)
    assert view.busy_pools("team", "train") == frozenset({"pool-b"})
    assert view.pool_holders("pool-b") == frozenset({("team", "other")})


def test_observe_from_the_cache_keeps_only_owned_pods_and_names_the_tails_to_read() -> None:
    job = job_body(status=running_status())
    failed = pod(job, 1, 0, 1, phase="Failed", exit_code=137)
    forged = pod(job, 1, 0, 1, phase="Failed", exit_code=1)
    forged["metadata"].update(name="forged", uid="forged-uid", ownerReferences=[])
    seen = observe(FakeReader([pod(job, 1, 0, 0), failed, forged], body=job), job)
    assert "forged" not in [p.name for p in seen.pods]
    assert tails_to_read(seen) == [(failed["metadata"]["name"], failed["metadata"]["uid"])]


def test_a_job_record_is_the_cache_s_own_copy_without_managed_fields() -> None:
    raw = job_body(status=running_status())
    raw["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    record = job_record(raw)[("team", "train")]
    raw["status"]["phase"] = "Failed"  # the watch's object changes later
    raw["metadata"]["labels"] = {"changed": "yes"}
    assert record["status"]["phase"] != "Failed"
    assert "labels" not in record["metadata"]
    assert "managedFields" not in record["metadata"]
    assert "managedFields" in raw["metadata"]  # the watch's own object is left as it was


def test_reconciles_share_the_job_record_instead_of_copying_it() -> None:
    record = job_record(job_body(status=running_status()))
    view = CachedView(
        jobs={k: [v] for k, v in record.items()}, pods={}, pools={}, nodes={}, heartbeats={}
    )
    assert view.job_body("team", "train") is view.job_body("team", "train")
    assert view.job_body("team", "gone") is None


@pytest.mark.parametrize(
    ("cached", "written", "winner"),
    [
        ("10", "12", "written"),
        ("12", "10", "cached"),
        ("12", "12", "cached"),
        ("abc", "12", "cached"),
        (None, "12", "written"),
    ],
)
def test_the_newer_of_two_versions_wins_and_opaque_versions_favour_the_watch(
    cached: str | None, written: str, winner: str
) -> None:
    a = {"metadata": {"resourceVersion": cached}} if cached is not None else None
    b = {"metadata": {"resourceVersion": written}}
    assert newer(a, b) is (a if winner == "cached" else b)


def test_a_pool_this_job_shares_with_another_is_busy_one_it_holds_alone_is_not() -> None:
    job = job_body(status=running_status())
    other = job_body(status=running_status())
    other["metadata"].update(name="other", uid="uid-other")
    mine_a, mine_b = pod(job, 1, 0, 0), pod(job, 1, 0, 1)
    theirs = pod(other, 1, 0, 0)
    theirs["metadata"]["labels"][labels.JOB] = "other"
    mine_a["spec"]["nodeSelector"] = {labels.NODEPOOL: "pool-a"}
    mine_b["spec"]["nodeSelector"] = {labels.NODEPOOL: "pool-b"}
    theirs["spec"]["nodeSelector"] = {labels.NODEPOOL: "pool-b"}
    view = FakeReader([mine_a, mine_b, theirs], body=job)
    assert view.busy_pools("team", "train") == frozenset({"pool-b"})
    assert view.busy_pools("team", "other") == frozenset({"pool-a", "pool-b"})


def test_a_node_status_renewal_changes_nothing_the_planner_reads() -> None:
    book = NodeBook()
    raw = node("pool-0-w0", "pool-0")
    node_record(raw, book)
    first = book.snapshot()
    assert book.take_change("pool-0-w0") and not book.take_change("pool-0-w0")
    renewed = copy.deepcopy(raw)
    renewed["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-01T12:00:10Z"
    node_record(renewed, book)
    assert not book.take_change("pool-0-w0")
    assert book.snapshot() is first  # the reconciles' snapshot is not rebuilt


@pytest.mark.parametrize("change", ["tainted", "tpus-short", "deleted"])
def test_a_node_change_the_planner_reads_makes_a_new_snapshot(change: str) -> None:
    book = NodeBook()
    node_record(node("pool-0-w0", "pool-0"), book)
    node_record(node("pool-0-w1", "pool-0"), book)
    first = book.snapshot()
    book.take_change("pool-0-w0")
    if change == "deleted":
        book.note("pool-0-w0", None)
    else:
        node_record(
            node(
                "pool-0-w0",
                "pool-0",
                taints=("x",) if change == "tainted" else (),
                tpu_unhealthy=change == "tpus-short",
            ),
            book,
        )
    assert book.take_change("pool-0-w0")
    second = book.snapshot()
    assert second is not first and first["pool-0-w0"] is not second.get("pool-0-w0")
    assert set(first) == {"pool-0-w0", "pool-0-w1"}  # a snapshot handed out never changes
    assert second["pool-0-w1"] is first["pool-0-w1"]


def test_a_tpu_shortfall_is_timed_from_the_first_event_that_showed_it() -> None:
    short = node_view(node("n0", "p", tpu_unhealthy=True))
    healthy = node_view(node("n0", "p"))
    first = note_tpu_shortfall({}, "n0", short, now=at(10))
    assert first == {"n0": at(10)}
    assert note_tpu_shortfall(first, "n0", short, now=at(30)) is first
    assert note_tpu_shortfall(first, "n0", healthy, now=at(40)) == {}
    assert note_tpu_shortfall(first, "n0", None, now=at(40)) == {}
    assert first == {"n0": at(10)}  # a record handed to a plan is never changed


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("short\nlog\n", "short\nlog\n"),
        ("x" * 30 + "\nline two\nline three\n", "line two\nline three\n"),
        ("password=" + "y" * 40, "y" * 24),
    ],
)
def test_a_log_tail_is_bounded_in_characters_from_a_lines_start(text: str, kept: str) -> None:
    assert bounded_tail(text, limit=24) == kept


@pytest.mark.parametrize(
    ("owners", "name", "cached"),
    [
        (lease_owner("train"), "train-heartbeat", True),
        ([], "train-heartbeat", False),
        (lease_owner("train"), "anything-else", False),
        (lease_owner("other"), "train-heartbeat", False),
        ([{**lease_owner("train")[0], "kind": "Job"}], "train-heartbeat", False),
    ],
    ids=["the-jobs-own", "no-owner", "another-name", "another-jobs-name", "not-a-tpujob"],
)
def test_only_a_jobs_own_heartbeat_lease_is_cached(
    owners: list[dict[str, Any]], name: str, cached: bool
) -> None:
    """A tenant's labelled Leases (256 KiB of annotations each) are not kept."""
    raw = lease(renewed=0, step=3)
    raw["metadata"].update(name=name, namespace="team", ownerReferences=owners)
    assert bool(lease_record(raw)) is cached


def test_a_heartbeat_keeps_only_the_health_annotations_and_each_bounded() -> None:
    raw = lease(renewed=0, step=3)
    raw["metadata"]["annotations"].update(
        {
            "padding.example/junk": "x" * 200_000,
            contract.HEARTBEAT_WORKER_RSS_BYTES: "1," * 100_000,
            contract.HEARTBEAT_HEALTH_STEP: "3",
        }
    )
    beat = heartbeat_view(raw)
    assert beat is not None
    assert set(beat.annotations) == {
        contract.HEARTBEAT_WORKER_RSS_BYTES,
        contract.HEARTBEAT_HEALTH_STEP,
    }
    assert sum(len(v) for v in beat.annotations.values()) <= 2 * MAX_HEALTH_CHARS


@pytest.mark.parametrize(
    ("to", "since"),
    [("False", 100), ("True", 100), ("Unknown", 38)],
    ids=["kubelet-posted-not-ready", "kubelet-posted-ready", "node-controller-unknown"],
)
def test_a_ready_transition_the_operator_saw_is_timed_by_its_clock(to: str, since: float) -> None:
    """The node's clock is 60 s slow: the kubelet writes a transition at 100 s as 40 s. The
    book times it by the operator's clock (100 s), and keeps that while the state holds;
    Unknown comes from the node controller, whose time (38 s here) is kept."""
    clock = [at(0)]
    book = NodeBook(clock=lambda: clock[0])
    start = "False" if to == "True" else "True"
    node_record(node("n", "pool-0", ready=start, ready_since=at(-50)), book)
    clock[0] = at(100)
    written = at(38) if to == "Unknown" else at(40)
    node_record(node("n", "pool-0", ready=to, ready_since=written), book)
    assert book.snapshot()["n"].ready_since == at(since)
    clock[0] = at(130)
    node_record(node("n", "pool-0", ready=to, ready_since=written), book)  # a status renewal
    assert book.snapshot()["n"].ready_since == at(since)
    assert node_view(node("n", "pool-0", ready=to, ready_since=written)).ready_since == written


def test_a_node_first_seen_keeps_its_own_transition_time() -> None:
    book = NodeBook(clock=lambda: at(100))
    node_record(node("n", "pool-0", ready="False", ready_since=at(30)), book)
    assert book.snapshot()["n"].ready_since == at(30)
