"""The cache check drops what two lists in a row miss, and wakes the jobs it concerns."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from tests.unit.builders import cluster, job_body, pod, running_status
from tests.unit.fakes import FakeReader, deps_for

from tpujob.controller.sweeps import find_ghosts
from tpujob.kube.errors import UnavailableError
from tpujob.kube.observe import observe


def world() -> tuple[dict[str, Any], FakeReader]:
    job = job_body(status=running_status())
    other = copy.deepcopy(job_body(status=running_status(pools=("pool-1",))))
    other["metadata"].update(name="other", uid="other-uid")
    theirs = pod(other, 1, 0, 0, node_name="pool-1-w0")
    theirs["metadata"]["uid"] = "their-pod"
    reader = FakeReader([pod(job, 1, 0, 0), pod(job, 1, 0, 1), theirs], body=job, nodes=cluster())
    return job, reader


def listing(reader: FakeReader, exists: dict[str, set[str]] | Exception) -> None:
    def uids(kind: str, namespaces: tuple[str, ...]) -> frozenset[str]:
        if isinstance(exists, Exception):
            raise exists
        return frozenset(exists[kind])

    object.__setattr__(reader, "uids", uids)


def test_pods_and_a_node_missing_from_two_lists_leave_every_read_and_wake_their_jobs() -> None:
    job, reader = world()
    deps = deps_for(reader)
    key = (job["metadata"]["namespace"], job["metadata"]["name"])
    deps.wakes.waker(key)
    uids = reader.cached_uids()
    gone_node = "uid-pool-2-w0"
    listing(
        reader,
        {
            "pods": {"uid-1-0-0"},  # worker 1 and the other job's pod went unseen
            "nodes": set(uids.nodes) - {gone_node},
            "jobs": set(uids.jobs),
        },
    )
    asyncio.run(find_ghosts(deps))  # missing once: maybe newer than the list
    assert len(observe(reader, job).pods) == 2
    assert "pool-1" in reader.busy_pools(*key)
    assert not deps.wakes.woken_at
    asyncio.run(find_ghosts(deps))
    assert [p.uid for p in observe(reader, job).pods] == ["uid-1-0-0"]
    assert "pool-1" not in reader.busy_pools(*key)
    assert gone_node not in {v.uid for v in reader.node_views().values()}
    assert reader.node("pool-2-w0") is None
    assert key in deps.wakes.woken_at


def test_a_job_missing_from_two_lists_is_gone_for_its_reconcile() -> None:
    job, reader = world()
    deps = deps_for(reader)
    uids = reader.cached_uids()
    listing(reader, {"pods": set(uids.pods), "nodes": set(uids.nodes), "jobs": set()})
    for _ in range(2):
        asyncio.run(find_ghosts(deps))
    assert reader.job_body(job["metadata"]["namespace"], job["metadata"]["name"]) is None


def test_a_list_that_fails_drops_nothing() -> None:
    job, reader = world()
    deps = deps_for(reader)
    listing(reader, {"pods": set(), "nodes": set(), "jobs": set()})
    asyncio.run(find_ghosts(deps))
    listing(reader, UnavailableError(503, "ServiceUnavailable", "apiserver restarting"))
    asyncio.run(find_ghosts(deps))
    assert len(observe(reader, job).pods) == 2
    assert reader.job_body(job["metadata"]["namespace"], job["metadata"]["name"]) is not None
