"""The kopf wiring: the indexes the reconciles read, the daemons, the login and the job events."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
from tests.unit.fakes import FakeReader, RecordingWriter, deps_for

from tpujob.api import Phase
from tpujob.controller import handlers
from tpujob.controller.deps import (
    KOPF_OWN_WATCHES,
    KOPF_REQUEST_CONNECTIONS,
    WATCHES_PER_SCOPE,
    kopf_connection_limit,
)
from tpujob.controller.reconcile import Deps
from tpujob.kube.indexes import Index


@pytest.mark.parametrize("kueue", [False, True], ids=["alone", "with-kueue"])
def test_the_cache_reads_kopfs_indexes_for_jobs_and_kueue_and_the_own_watches_for_the_rest(
    kueue: bool,
) -> None:
    import asyncio

    registry = kopf.OperatorRegistry()
    handlers.register(registry, kueue=kueue)
    ids = sorted(h.id for h in registry._indexing.get_all_handlers())
    kueue_ids = ["tpujob_flavors", "tpujob_workloads"] if kueue else []
    assert ids == sorted(["tpujob_jobs", *kueue_ids])
    attach = next(
        h for h in registry._activities.get_all_handlers() if h.id.endswith("attach_cache")
    )
    deps = Deps(reader=FakeReader([]), writer=RecordingWriter())  # type: ignore[arg-type]
    indexes = {name: {("team", name): ["value"]} for name in ids}
    asyncio.run(attach.fn(memo=deps, **indexes))  # no watch client: no informer started
    assert deps.view is not None
    assert deps.view.jobs is indexes["tpujob_jobs"]
    assert (deps.view.workloads is not None) == kueue
    if kueue:
        assert deps.view.workloads is indexes["tpujob_workloads"]
        assert deps.view.flavors is indexes["tpujob_flavors"]
    own = [deps.view.pods, deps.view.pools, deps.view.node_pods, deps.view.nodes]
    assert all(isinstance(index, Index) for index in [*own, deps.view.heartbeats])
    assert deps.view.node_book is deps.node_book


def test_a_job_whose_daemon_stops_lets_its_pools_go_and_wakes_a_waiting_job() -> None:
    import asyncio

    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    daemon = next(h for h in registry._spawning.get_all_handlers() if h.id.endswith("run_job"))
    deps = deps_for(FakeReader([]), RecordingWriter())
    deps.pools.assign("pool-0", ("team", "deleted"))
    deps.pools.assign("pool-1", ("team", "other"))
    shape = ("tpu-v4-podslice", "2x2x2")
    deps.metrics.record_job("team", "deleted", Phase.RUNNING, 0.9, 1)
    deps.jobs.written[("team", "deleted")] = {"status": {}}

    async def stop_a_deleted_job() -> bool:
        waiting = deps.wakes.waker(("team", "waiting"))
        deps.wakes.settled(("team", "waiting"), finished=False, waiting_for=shape)
        await daemon.fn(
            name="deleted",
            namespace="team",
            stopped=True,
            memo=deps,
            logger=None,
            spec={"tpu": {"accelerator": shape[0], "topology": shape[1]}},
        )
        return waiting.is_set()

    assert asyncio.run(stop_a_deleted_job())
    assert deps.pools.holders == {"pool-1": ("team", "other")}
    # Nothing else kept of it either: no book entry, no metric series.
    assert ("team", "deleted") not in deps.jobs.written
    series = [
        s.labels
        for metric in deps.metrics.registry.collect()
        for s in metric.samples
        if s.labels.get("job") == "deleted"
    ]
    assert series == []


def test_no_handler_reads_the_diff_base_the_operator_does_not_keep() -> None:
    # NoDiffBase keeps no essence of watched objects: right only while no on-create,
    # on-update, on-resume or on-delete handler (kopf's changing handlers) is registered.
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    assert list(registry._changing.get_all_handlers()) == []
    assert [h.id.rsplit(".", 1)[-1] for h in registry._spawning.get_all_handlers()] == ["run_job"]
    base = handlers.NoDiffBase()
    body = kopf.Body({"metadata": {"name": "n", "labels": {"a": "b"}}, "spec": {"x": 1}})
    # kopf diffs what fetch and build return: equal, so no change is ever reported.
    assert base.fetch(body=body) == base.build(body=body) == {}


@pytest.mark.parametrize(
    ("namespaces", "limit"),
    [
        ((), WATCHES_PER_SCOPE + KOPF_OWN_WATCHES + KOPF_REQUEST_CONNECTIONS),
        (("team-a",), WATCHES_PER_SCOPE + KOPF_OWN_WATCHES + KOPF_REQUEST_CONNECTIONS),
        (
            ("team-a", "team-b", "team-c"),
            3 * WATCHES_PER_SCOPE + KOPF_OWN_WATCHES + KOPF_REQUEST_CONNECTIONS,
        ),
        (("team-*",), 0),
        (("team-a", "ml-[ab]"), 0),
        (("team-a,team-b",), 0),
        (("!kube-system",), 0),
    ],
)
def test_kopfs_connections_leave_every_watch_stream_one(
    namespaces: tuple[str, ...], limit: int
) -> None:
    """Bounded where the watch streams are known; unbounded where patterns make them unknown."""
    assert kopf_connection_limit(namespaces) == limit


@pytest.mark.parametrize("limit", [0, 7])
def test_login_caps_kopfs_session_at_the_deps_connection_limit(
    limit: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client library's credentials, in a session of at most `limit` connections; with
    no limit, kopf's own session (unbounded) from the same credentials."""
    import asyncio
    import logging

    import kubernetes

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: secret-token}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    # The client library reads $KUBECONFIG once, when imported.
    monkeypatch.setattr(
        kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig)
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    # Loading a kubeconfig replaces the client library's process-wide default configuration.
    monkeypatch.setattr(
        kubernetes.client.Configuration, "_default", kubernetes.client.Configuration._default
    )
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    login = next(h for h in registry._activities.get_all_handlers() if h.id.endswith("login"))
    deps = deps_for(FakeReader([]), RecordingWriter())
    deps.kopf_connections = limit

    async def log_in() -> tuple[object, int | None, str | None]:
        found = await login.fn(
            memo=deps, logger=logging.getLogger("test"), settings=kopf.OperatorSettings()
        )
        if not isinstance(found, kopf.AiohttpSession):
            return found, None, None
        session = found.aiohttp_session
        seen = (
            session.connector.limit if session.connector else None,
            session.headers.get("Authorization"),
        )
        await session.close()
        return found, *seen

    found, connections, authorization = asyncio.run(log_in())
    if not limit:
        assert isinstance(found, kopf.ConnectionInfo)
        assert (found.server, found.token) == ("https://127.0.0.1:6443", "secret-token")
        return
    assert isinstance(found, kopf.AiohttpSession)
    assert found.server == "https://127.0.0.1:6443"
    assert (connections, authorization) == (limit, "Bearer secret-token")


@pytest.mark.parametrize(
    ("awaiting", "finalizers", "woken"),
    [
        (True, ["tpujob.dev/operator"], True),  # the finalizer it waits for has landed
        (True, [], False),  # another change: the wait goes on
        (False, ["tpujob.dev/operator"], False),  # a job not waiting: its own writes wake nothing
    ],
)
def test_a_job_event_wakes_its_daemon_only_when_the_awaited_finalizer_lands(
    awaiting: bool, finalizers: list[str], woken: bool
) -> None:
    import asyncio

    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    handler = next(h for h in registry._watching.get_all_handlers() if h.id.endswith("job_changed"))
    deps = deps_for(FakeReader([]), RecordingWriter())
    key = ("team", "train")
    if awaiting:
        deps.jobs.awaiting_finalizer.add(key)

    async def event() -> bool:
        waker = deps.wakes.waker(key)
        await handler.fn(namespace="team", name="train", meta={"finalizers": finalizers}, memo=deps)
        return waker.is_set()

    assert asyncio.run(event()) is woken
    assert (key in deps.jobs.awaiting_finalizer) is (awaiting and not woken)
