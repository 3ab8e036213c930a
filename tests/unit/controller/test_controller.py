"""One reconcile through the shell: status first, then fence, effects, and Events last."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from tests.unit.builders import (
    at,
    cluster,
    iso,
    job_body,
    lease_owner,
    pod,
    running_status,
    trainer_message,
)
from tests.unit.fakes import FakeReader, RecordingWriter, deps_for, index

from tpujob.api import contract
from tpujob.controller import watches
from tpujob.controller.deps import Stream
from tpujob.controller.reconcile import (
    CACHE_WAIT_SECONDS,
    FINALIZER_POLL_SECONDS,
    REFUSED_RETRY_SECONDS,
    SLOW_PLAN_RETRY_SECONDS,
    Deps,
    reconcile,
)
from tpujob.kube.cache import lease_record
from tpujob.kube.errors import (
    ConflictError,
    ForbiddenError,
    InvalidError,
    KubeError,
    UnavailableError,
)
from tpujob.kube.indexes import Change, Indexer
from tpujob.kube.informer import Informer, Watched
from tpujob.observed.views import heartbeat_view


def run(
    reader: FakeReader, writer: RecordingWriter, deps: Deps | None = None, now: float = 20
) -> float | None:
    deps = deps or deps_for(reader, writer)
    deps.clock = lambda: at(now)
    return asyncio.run(reconcile(deps, "team", "train"))


def node_listing(deps: Deps, now: float) -> None:
    """The node watch's first listing, as the operator's node handler sees it: one event per
    node of the cache (the handler keeps the TPU-shortfall record the planner reads)."""
    assert deps.view is not None
    names = list(deps.view.node_views())
    deps.clock = lambda: at(now)
    for name in names:
        watches.node_changed(deps, Change(None, {"metadata": {"name": name}}))


def launching_job() -> dict[str, Any]:
    status = running_status(attempt=2)
    status["phase"] = "Recovering"
    del status["currentAttempt"]["launchedTime"]
    return job_body(status=status)


def test_a_launch_writes_status_then_the_fence_then_the_pods_then_events() -> None:
    writer = RecordingWriter()
    run(FakeReader([], body=launching_job()), writer)
    kinds = writer.kinds()
    assert kinds[0] == "status"
    assert ("fence", "2") in writer.calls
    first_pod = next(
        i for i, (k, d) in enumerate(writer.calls) if k == "create" and d.startswith("Pod/")
    )
    assert kinds.index("fence") < first_pod
    events = [i for i, k in enumerate(kinds) if k == "event"]
    assert all(i > first_pod for i in events)


def test_a_reconcile_before_the_cache_is_attached_waits_for_it_and_touches_nothing() -> None:
    writer = RecordingWriter()
    deps = Deps(reader=FakeReader([], body=launching_job()), writer=writer)  # type: ignore[arg-type]
    deps.jobs.written[("team", "train")] = launching_job()
    assert run(FakeReader([]), writer, deps) == CACHE_WAIT_SECONDS
    assert writer.calls == []
    assert ("team", "train") in deps.jobs.written  # not taken for deleted


def test_a_status_conflict_leaves_no_effect_behind() -> None:
    writer = RecordingWriter(fail={"status": ConflictError(409, "Conflict", "changed")})
    with pytest.raises(ConflictError):
        run(FakeReader([], body=launching_job()), writer)
    assert writer.kinds() == ["status"]


def test_no_pod_is_created_when_the_fence_cannot_be_written() -> None:
    writer = RecordingWriter(fail={"fence": UnavailableError(0, "ConnectionRefused", "")})
    with pytest.raises(UnavailableError):
        run(FakeReader([], body=launching_job()), writer)
    assert "create" not in writer.kinds()


def test_a_failure_is_on_record_before_pods_are_deleted_or_nodes_marked() -> None:
    job = job_body(status=running_status())
    message = trainer_message(contract.ExitCode.SHAPE_MISMATCH, "shapes (8,) and (4,)")
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=1, message=message)]
    writer = RecordingWriter()
    run(FakeReader(pods, body=job), writer)
    assert writer.calls[0] == ("status", "Failed")
    assert writer.kinds()[-1] == "event"


def test_a_finished_job_that_did_not_change_writes_nothing() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0, phase="Succeeded"), pod(job, 1, 0, 1, phase="Succeeded")]
    first = RecordingWriter()
    run(FakeReader(pods, body=job), first)
    assert first.calls[0] == ("status", "Succeeded")
    assert ("event", "Succeeded") in first.calls
    # The next reconcile tells the journaled Event again (its name makes it a no-op) and
    # clears the journal; after that a finished job costs no write at all.
    told = job_body(status=first.statuses[-1])
    second = RecordingWriter()
    run(FakeReader(pods, body=told), second)
    assert second.kinds() == ["status", "event"]
    assert not second.statuses[-1].get("pendingEvents")
    third = RecordingWriter()
    run(FakeReader(pods, body=job_body(status=second.statuses[-1])), third)
    assert third.kinds() == []


def test_an_event_is_named_by_its_content_so_telling_it_twice_is_a_no_op() -> None:
    from tpujob.kube.apply import event_name
    from tpujob.plan.result import EventSpec

    meta = {"name": "train", "uid": "u1"}
    spec = EventSpec("Warning", "FailureDiagnosed", "[SOFT] killed", at(20))
    assert event_name(meta, spec) == event_name(meta, spec)
    assert event_name(meta, spec) != event_name({**meta, "uid": "u2"}, spec)
    assert event_name(meta, spec) != event_name(
        meta, EventSpec("Warning", "FailureDiagnosed", "[SOFT] killed", at(21))
    )


@pytest.mark.parametrize(
    "refusal",
    [
        ForbiddenError(403, "Forbidden", 'pods "train-2-0-0" is forbidden: exceeded quota: small'),
        InvalidError(422, "Invalid", "spec.containers[0].securityContext: Invalid value"),
        KubeError(400, "BadRequest", 'admission webhook "policy.example.com" denied the request'),
    ],
    ids=["quota", "invalid", "webhook"],
)
def test_a_refused_pod_shows_why_in_the_status_and_is_retried(refusal: KubeError) -> None:
    writer = RecordingWriter(fail={"create-pod": refusal})
    delay = run(FakeReader([], body=launching_job()), writer)
    assert delay == REFUSED_RETRY_SECONDS
    refused = next(c for c in writer.statuses[-1]["conditions"] if c["type"] == "PodsRefused")
    assert refused["status"] == "True"
    assert refusal.message in refused["message"]
    assert ("event", "FailedCreate") in writer.calls


def test_pods_refused_clears_once_every_pod_exists() -> None:
    status = running_status()
    status["conditions"] = [
        {
            "type": "PodsRefused",
            "status": "True",
            "reason": "FailedCreate",
            "message": "exceeded quota",
            "lastTransitionTime": "2026-01-01T12:00:00Z",
        }
    ]
    job = job_body(status=status)
    writer = RecordingWriter()
    run(FakeReader([pod(job, 1, 0, 0), pod(job, 1, 0, 1)], body=job), writer)
    refused = next(c for c in writer.statuses[-1]["conditions"] if c["type"] == "PodsRefused")
    assert refused["status"] == "False"


def test_a_tpu_shortfall_fails_the_node_only_after_its_grace() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    nodes = cluster(**{"pool-0-w1": {"tpu": 2}})
    writer = RecordingWriter()
    reader = FakeReader(pods, body=job, nodes=nodes)
    deps = deps_for(reader, writer)
    node_listing(deps, now=20)  # the operator's node watch starts; its record starts here
    run(reader, writer, deps, now=20)
    assert "delete" not in writer.kinds()  # a device plugin restart looks like this at first
    run(reader, writer, deps, now=20 + 61)
    assert ("delete", "train-1-0-1") in writer.calls
    assert writer.statuses[-1]["failedNodes"][0]["name"] == "pool-0-w1"


def test_planning_over_its_budget_is_a_condition_on_that_job_only() -> None:
    job = job_body(
        status=running_status(),
        recovery={"rules": [{"messagePattern": "(a|aa)+$", "class": "soft"}]},
    )
    writer = RecordingWriter()
    reader = FakeReader([pod(job, 1, 0, 0), pod(job, 1, 0, 1)], body=job)
    deps = deps_for(reader, writer, plan_budget_seconds=0)
    delay = run(reader, writer, deps)
    assert delay == SLOW_PLAN_RETRY_SECONDS
    slow = next(c for c in writer.statuses[-1]["conditions"] if c["type"] == "PlanningSlow")
    assert slow["status"] == "True"
    assert "(a|aa)+$" in slow["message"]
    assert writer.kinds() == ["status"]  # nothing acted on an unfinished plan


def test_a_finished_job_sleeps_until_its_pods_change_and_node_events_skip_it() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0, phase="Succeeded"), pod(job, 1, 0, 1, phase="Succeeded")]
    writer = RecordingWriter()
    reader = FakeReader(pods, body=job)
    deps = deps_for(reader, writer)
    running = deps.wakes.waker(("team", "other"))
    finished = deps.wakes.waker(("team", "train"))
    run(reader, writer, deps)  # the reconcile that finds it finished
    reader.replace_body(job_body(status=writer.statuses[-1]))
    delay = run(reader, writer, deps)
    assert delay is not None and delay >= 3600
    deps.wakes.wake_live([("team", "other"), ("team", "train")], at=0.0)  # a node changed
    assert running.is_set() and not finished.is_set()
    deps.wakes.wake(("team", "train"), at=0.0)  # its own pods still wake it
    assert finished.is_set()


class TwoJobs(FakeReader):
    """Reads for two new jobs of one namespace, created at once (no pods exist yet)."""

    def __init__(self) -> None:
        super().__init__([])
        self.bodies = {}
        for name in ("a", "b"):
            body = job_body()
            body["metadata"].update(name=name, uid=f"uid-{name}")
            self.bodies[name] = body

    def job_body(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.bodies[name]


def test_jobs_planned_at_once_never_share_a_pool_and_one_too_many_waits() -> None:
    reader, writer = TwoJobs(), RecordingWriter()
    # What is tested is the claims, not the planning budget: a plan abandoned for overrunning
    # the default 10 s (seen once on a machine loaded far past its cores) decides nothing.
    deps = deps_for(reader, writer, plan_budget_seconds=300)
    deps.clock = lambda: at(0)

    async def both() -> None:
        await asyncio.gather(*(reconcile(deps, "team", n) for n in ("a", "b")))

    asyncio.run(both())
    pools = [s["currentAttempt"]["placement"][0]["nodePool"] for s in writer.statuses]
    assert len(pools) == 2 and len(set(pools)) == 2, pools
    assert set(deps.pools.holders) == set(pools)
    # With every pool claimed by others, a job about to launch waits rather than share one.
    reader.bodies["a"] = job_body(status={**writer.statuses[0], "currentAttempt": {}})
    reader.bodies["a"]["metadata"].update(name="a", uid="uid-a")
    deps.pools.claim(("team", "a"), None)
    deps.pools.assign("pool-0", ("team", "c"))
    deps.pools.assign("pool-2", ("team", "d"))
    before = len(writer.calls)
    assert asyncio.run(reconcile(deps, "team", "a")) is not None
    waiting = writer.statuses[-1]
    running = next(c for c in waiting["conditions"] if c["type"] == "Running")
    assert running["reason"] == "WaitingForPool"
    assert not any(k == "create" for k, _ in writer.calls[before:])


def test_a_job_with_no_free_pool_is_told_which_zones_offer_its_shape() -> None:
    from tpujob.gcp.catalogue import Catalogue, Offer, catalogue_name
    from tpujob.gcp.client import CatalogueConfig, CatalogueSource

    name = catalogue_name("tpu-v4-podslice", "2x2x2")
    assert name is not None
    source = CatalogueSource(CatalogueConfig(project="p", zones=("us-central2-b",)))
    source.catalogue = Catalogue(
        project="p", offers={"us-central2-b": (Offer(name.type_name),), "europe-west4-a": ()}
    )
    reader, writer = FakeReader([], body=launching_job()), RecordingWriter()
    deps = deps_for(reader, writer, catalogue=source)
    for i in range(3):
        deps.pools.assign(f"pool-{i}", ("team", f"other-{i}"))
    run(reader, writer, deps)
    running = next(c for c in writer.statuses[-1]["conditions"] if c["type"] == "Running")
    assert running["reason"] == "WaitingForPool"
    assert f"create a {name.type_name} pool in us-central2-b" in running["message"]
    assert "europe-west4-a" not in running["message"]


def test_a_change_of_progress_alone_is_written_at_most_once_per_interval() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]

    def lease(step: int) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "train-heartbeat",
                "namespace": "team",
                "ownerReferences": lease_owner(),
                "annotations": {
                    contract.HEARTBEAT_STEP: str(step),
                    contract.HEARTBEAT_ATTEMPT: "1",
                },
            },
            "spec": {"renewTime": "2026-01-01T12:00:19Z"},
        }

    writer = RecordingWriter()
    reader = FakeReader(pods, body=job, lease=lease(10))
    deps = deps_for(reader, writer)
    run(reader, writer, deps, now=20)
    assert writer.kinds().count("status") == 1
    written = len(writer.statuses)
    reader.replace_body(job_body(status=writer.statuses[-1]))
    for now, step in ((25, 20), (30, 30)):
        reader.heartbeats.clear()  # type: ignore[attr-defined]
        reader.heartbeats.update({("team", "train-heartbeat"): [heartbeat_view(lease(step))]})  # type: ignore[attr-defined]
        run(reader, writer, deps, now=now)
    assert len(writer.statuses) == written  # 10 s after the last write: it waits
    run(reader, writer, deps, now=40)
    assert len(writer.statuses) == written + 1
    assert writer.statuses[-1]["progress"]["step"] == 30


def test_the_next_reconcile_plans_on_the_status_it_wrote_when_the_watch_is_behind() -> None:
    writer = RecordingWriter()
    reader = FakeReader([], body=launching_job())
    deps = deps_for(reader, writer)
    writer.bump_version = True
    run(reader, writer, deps)
    assert writer.kinds().count("fence") == 1
    # The cache still shows the body from before the launch; planning on it would launch the
    # same attempt again. The body the write returned is newer, so it is used instead.
    run(reader, writer, deps, now=21)
    launches = {st["currentAttempt"]["launchedTime"] for st in writer.statuses}
    assert len(launches) == 1
    assert [e["kind"] for e in writer.statuses[-1]["timeline"]].count("PodsCreated") == 1
    # Nor are the pods it created moments ago created again while the watch catches up.
    assert writer.kinds().count("fence") == 1
    assert len([d for k, d in writer.calls if k == "create" and d.startswith("Pod/")]) == 2


def test_a_failed_pods_tail_is_read_once() -> None:
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=137)]

    class CountingReader(FakeReader):
        reads = 0

        def log_tail(self, namespace: str, pod: str) -> str:
            CountingReader.reads += 1
            return "killed"

    reader = CountingReader(pods, body=job)
    deps = deps_for(reader, RecordingWriter())
    for now in (20, 21, 22):
        run(reader, RecordingWriter(), deps, now=now)
    assert CountingReader.reads == 1


def test_a_soft_blame_is_saved_in_the_ledger_after_the_status_and_survives_a_restart() -> None:
    from tpujob.controller.ledger_store import LEDGER_CONFIGMAP, load_ledger
    from tpujob.diagnosis.memory import LEDGER_KEY

    job = job_body(status=running_status())
    # A host-level mechanism, read from the log: the node's TPU held by a foreign process.
    logs = {"train-1-0-1": "RuntimeError: open(/dev/accel0): Device or resource busy"}
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1, phase="Failed", exit_code=1)]
    reader, writer = FakeReader(pods, body=job, logs=logs), RecordingWriter()
    deps = deps_for(reader, writer, ledger_namespace="tpujob-system")
    run(reader, writer, deps)
    kinds = writer.kinds()
    assert kinds.index("status") < kinds.index("config")
    saved = writer.configs[("tpujob-system", LEDGER_CONFIGMAP)][LEDGER_KEY]
    assert '"team/train"' in saved
    reader.configs.update(writer.configs)  # type: ignore[attr-defined]
    restarted = deps_for(reader, ledger_namespace="tpujob-system")
    asyncio.run(load_ledger(restarted))
    assert [(b.node, b.job) for b in restarted.ledger.blames] == [
        (pods[1]["spec"]["nodeName"], "team/train")
    ]
    assert restarted.ledger.blames[0].at == at(20).timestamp()


def test_after_an_outage_nothing_is_planned_until_the_api_answers_and_ages_count_from_then() -> (
    None
):
    job = job_body(status=running_status())
    pods = [pod(job, 1, 0, 0), pod(job, 1, 0, 1)]
    reader = FakeReader(pods, body=job)
    writer = RecordingWriter(fail={"status": UnavailableError(0, "ConnectionRefused", "")})
    deps = deps_for(reader, writer)
    with pytest.raises(UnavailableError):
        run(reader, writer, deps, now=20)
    assert deps.api.down
    reader.api_unreachable = True  # type: ignore[attr-defined]
    quiet = RecordingWriter()
    deps.writer = quiet  # type: ignore[assignment]
    with pytest.raises(UnavailableError):
        run(reader, quiet, deps, now=25)
    assert quiet.calls == []  # still down: no plan, no write
    reader.api_unreachable = False  # type: ignore[attr-defined]
    run(reader, quiet, deps, now=60)
    assert not deps.api.down
    assert deps.api.reachable_since == at(60)


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (UnavailableError(0, "ConnectionRefusedError", "refused"), True),
        (UnavailableError(0, "ReadTimeoutError", "timed out"), True),
        (UnavailableError(500, "InternalError", 'failed calling webhook "quota.x"'), False),
        (UnavailableError(429, "TooManyRequests", "fair share"), False),
    ],
)
def test_only_an_api_that_does_not_answer_is_an_outage_for_every_job(
    error: UnavailableError, outage: bool
) -> None:
    job = job_body(status=running_status())
    reader = FakeReader([pod(job, 1, 0, 0), pod(job, 1, 0, 1)], body=job)
    writer = RecordingWriter(fail={"status": error})
    deps = deps_for(reader, writer)
    deps.api.reachable_since = at(0)
    with pytest.raises(UnavailableError):
        run(reader, writer, deps, now=20)
    assert deps.api.down is outage
    if not outage:
        assert deps.api.reachable_since == at(0)  # the neighbours' stall clocks run on


def test_jobs_retrying_after_an_outage_send_one_probe_and_all_go_on_when_it_answers() -> None:
    job = job_body(status=running_status())
    reader = FakeReader([pod(job, 1, 0, 0), pod(job, 1, 0, 1)], body=job)
    probes = []
    answers = reader.api_answers

    def counted() -> None:
        probes.append(1)
        answers()

    reader.api_answers = counted  # type: ignore[method-assign]
    deps = deps_for(reader, RecordingWriter())
    deps.clock = lambda: at(60)
    deps.api.down = True

    async def many() -> list[float | None]:
        return list(await asyncio.gather(*(reconcile(deps, "team", "train") for _ in range(5))))

    delays = asyncio.run(many())
    assert len(probes) == 1
    assert len(delays) == 5 and not deps.api.down


@pytest.mark.parametrize(("namespace", "bound"), [("team", True), ("kube-system", False)])
def test_the_operator_binds_itself_lease_rights_before_the_fence_never_in_system_namespaces(
    namespace: str, bound: bool
) -> None:
    from tpujob.controller.deps import LeaseAccess

    body = launching_job()
    body["metadata"]["namespace"] = namespace
    reader, writer = FakeReader([], body=body), RecordingWriter()
    access = LeaseAccess(role="op-leases", account="op", account_namespace="ops")
    deps = deps_for(reader, writer, lease_access=access)
    deps.clock = lambda: at(20)
    asyncio.run(reconcile(deps, namespace, "train"))
    kinds = writer.kinds()
    assert (("bind", f"{namespace}/op-leases") in writer.calls) is bound
    if bound:
        assert kinds.index("bind") < kinds.index("fence")


def test_a_lease_the_api_refuses_shows_why_like_a_refused_pod() -> None:
    refusal = ForbiddenError(403, "Forbidden", "leases is forbidden")
    writer = RecordingWriter(fail={"fence": refusal})
    delay = run(FakeReader([], body=launching_job()), writer)
    assert delay == REFUSED_RETRY_SECONDS
    refused = next(c for c in writer.statuses[-1]["conditions"] if c["type"] == "PodsRefused")
    assert "leases is forbidden" in refused["message"]


@pytest.mark.parametrize(
    ("owners", "refused"),
    [(frozenset({"job-uid"}), False), (frozenset({"old-job-uid"}), True), (frozenset(), True)],
    ids=["its-own", "an-earlier-incarnations", "orphaned"],
)
def test_a_pod_name_taken_by_a_pod_that_is_not_the_jobs_is_shown_not_waited_on(
    owners: frozenset[str], refused: bool
) -> None:
    writer = RecordingWriter()
    writer.existing_pods = {"train-2-0-0": owners}
    run(FakeReader([], body=launching_job()), writer)
    condition = [c for c in writer.statuses[-1]["conditions"] if c["type"] == "PodsRefused"]
    if refused:
        assert condition and "train-2-0-0" in condition[0]["message"]
        assert "not this job's" in condition[0]["message"]
    else:
        assert not condition or condition[0]["status"] == "False"


class CountingWriter(RecordingWriter):
    """Counts status writes in progress at once (each holds its thread a moment)."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.now = self.most = 0

    def write_status(self, body: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(0.02)
        with self.lock:
            self.now -= 1
        return super().write_status(body, status)


@pytest.mark.parametrize("slots", [1, 3])
def test_no_more_reconciles_run_at_once_than_there_are_slots(slots: int) -> None:
    """A burst of jobs waking together must not hold every job's reconcile in memory at once."""
    writer = CountingWriter()
    reader = FakeReader([], body=launching_job())
    deps = deps_for(reader, writer)
    deps.clock = lambda: at(20)

    async def burst() -> list[float | None]:
        deps.reconcile_slots = asyncio.Semaphore(slots)
        return await asyncio.gather(*(reconcile(deps, "team", "train") for _ in range(12)))

    results = asyncio.run(burst())
    assert len(results) == 12 and writer.most == slots


def beat(step: int, renewed: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train-heartbeat",
            "namespace": "team",
            "ownerReferences": lease_owner(),
            "annotations": {contract.HEARTBEAT_STEP: str(step), contract.HEARTBEAT_ATTEMPT: "1"},
        },
        "spec": {"renewTime": renewed},
    }


@pytest.mark.parametrize(
    ("case", "writes"),
    [
        ("waiting for a pool, a minute later", False),
        ("running, the same step a minute later", False),
        ("running, the trainer's step moved", True),
    ],
)
def test_the_clock_alone_never_writes_a_status(case: str, writes: bool) -> None:
    """Only the goodput breakdown grows with time; a thousand waiting jobs must not rewrite it."""
    if case.startswith("waiting"):
        reader = FakeReader([], body=job_body(), nodes=[])
    else:
        job = job_body(status=running_status())
        reader = FakeReader(
            [pod(job, 1, 0, 0), pod(job, 1, 0, 1)], body=job, lease=beat(10, "2026-01-01T12:00:19Z")
        )
    for now in (20, 21):  # settled: the first reconcile only validates a new job
        first = RecordingWriter()
        run(reader, first, now=now)
        if first.statuses:
            reader.replace_body(job_body(status=first.statuses[-1]))
    reader.heartbeats.clear()  # type: ignore[attr-defined]
    step = 40 if writes else 10
    reader.heartbeats.update(  # type: ignore[attr-defined]
        index([lease_record(beat(step, "2026-01-01T12:01:19Z"))])
    )
    later = RecordingWriter()
    run(reader, later, now=80)
    assert ("status" in later.kinds()) is writes


@pytest.mark.parametrize(
    ("first", "second", "parsed_again"),
    [
        (("uid-1", "7"), ("uid-1", "7"), False),  # the same version of the same job
        (("uid-1", "7"), ("uid-1", "8"), True),  # changed since
        (("uid-1", "7"), ("uid-2", "7"), True),  # another job under the name
        (("uid-1", ""), ("uid-1", ""), True),  # no version to tell them apart
    ],
)
def test_a_job_is_parsed_again_only_when_its_version_changed(
    first: tuple[str, str], second: tuple[str, str], parsed_again: bool
) -> None:
    deps = deps_for(FakeReader([]), RecordingWriter())

    def body(uid: str, version: str) -> dict[str, Any]:
        job = job_body(status=running_status())
        job["metadata"].update(uid=uid, resourceVersion=version)
        return job

    one = deps.jobs.parse(("team", "train"), body(*first))
    two = deps.jobs.parse(("team", "train"), body(*second))
    assert (one is not two) is parsed_again
    assert two.metadata["uid"] == second[0]


@pytest.mark.parametrize(
    ("finalizers", "age_seconds", "waits"),
    [
        ([], 1.0, True),  # created a moment ago, kopf's patch not seen yet
        (["tpujob.dev/operator"], 1.0, False),  # it landed: go on
        ([], 30.0, False),  # it never came: the job is delayed, never stopped
        ([], -5.0, False),  # a clock behind the apiserver's waits for nothing
    ],
)
def test_a_new_job_waits_for_kopf_s_finalizer_before_its_first_status_write(
    finalizers: list[str], age_seconds: float, waits: bool
) -> None:
    job = job_body()
    job["metadata"]["finalizers"] = finalizers
    job["metadata"]["creationTimestamp"] = iso(at(20 - age_seconds))
    writer = RecordingWriter()
    deps = deps_for(FakeReader([], body=job), writer, finalizer="tpujob.dev/operator")
    delay = run(deps.reader, writer, deps, now=20)  # type: ignore[arg-type]
    assert (writer.calls == []) is waits
    assert (("team", "train") in deps.jobs.awaiting_finalizer) is waits
    assert (delay == FINALIZER_POLL_SECONDS) is waits


def lease_stream(kind: str, *, broken: bool = False, resumed: float | None = None) -> Informer:
    """An informer as the operator's watches hold it, in the state its stream left it."""
    loop = asyncio.new_event_loop()
    loop.close()  # never started: only its state is read
    informer = Informer(
        Watched(kind, lambda **_: None, kind=kind), Indexer({}), lambda _: None, loop
    )
    informer.broken = broken
    informer.resumed_at = at(resumed) if resumed is not None else None
    return informer


@pytest.mark.parametrize(
    ("streams", "now", "restarted"),
    [
        ([], 100, True),  # never broken: the heartbeat's whole age counts
        ([lease_stream(Stream.LEASES, broken=True)], 100, False),  # renewals cannot be seen
        ([lease_stream(Stream.LEASES, resumed=90)], 100, False),  # back 10 s ago, limit 20 s
        ([lease_stream(Stream.LEASES, resumed=90)], 115, True),  # a whole limit since it resumed
        ([lease_stream(Stream.PODS, broken=True)], 100, True),  # other streams hold no clock
        (  # one Lease stream per namespace: the latest return counts
            [lease_stream(Stream.LEASES, resumed=30), lease_stream(Stream.LEASES, resumed=90)],
            100,
            False,
        ),
    ],
)
def test_a_heartbeat_ages_only_while_its_lease_stream_is_watched(
    streams: list[Informer], now: float, restarted: bool
) -> None:
    """An informer's retry may come well after the API answers again: until its watch is back
    no renewal can be seen, and a stall limit counts from then."""
    job = job_body(status=running_status(), recovery={"stallTimeoutSeconds": 20})
    reader = FakeReader(
        [pod(job, 1, 0, 0), pod(job, 1, 0, 1)], body=job, lease=beat(10, iso(at(19)))
    )
    writer = RecordingWriter()
    deps = deps_for(reader, writer)
    deps.informers.extend(streams)
    run(reader, writer, deps, now=now)
    assert any(s.get("attempt") == 2 for s in writer.statuses) is restarted
