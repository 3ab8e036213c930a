"""The indexes of one watched kind: events and listings in, what reconciles read out."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from tpujob.kube.indexes import Indexer, object_key, stub


def pod(name: str, job: str | None, *, node: str = "", namespace: str = "team") -> dict[str, Any]:
    labels = {"job": job} if job else {}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}", "labels": labels},
        "spec": {"nodeName": node, "nodeSelector": {"pool": "p"}},
        "status": {"phase": "Running"},
    }


def by_job(raw: Mapping[str, Any]) -> dict[Hashable, str]:
    job = raw["metadata"]["labels"].get("job")
    return {(raw["metadata"]["namespace"], job): raw["metadata"]["name"]} if job else {}


def by_node(raw: Mapping[str, Any]) -> dict[Hashable, str]:
    node = raw["spec"].get("nodeName")
    return {node: raw["metadata"]["name"]} if node else {}


def indexer() -> Indexer:
    return Indexer({"jobs": by_job, "nodes": by_node})


def contents(found: Indexer, name: str) -> dict[Hashable, list[Any]]:
    return {key: sorted(values) for key, values in found.indexes[name].items()}


def test_events_put_move_and_drop_an_objects_entries_in_every_index() -> None:
    found = indexer()
    found.apply("ADDED", found.prepare(pod("a", "train", node="n1")))
    found.apply("ADDED", found.prepare(pod("b", "train")))
    assert contents(found, "jobs") == {("team", "train"): ["a", "b"]}
    assert contents(found, "nodes") == {"n1": ["a"]}
    # Relabelled and moved: its old entries go with the same event.
    found.apply("MODIFIED", found.prepare(pod("a", "other", node="n2")))
    assert contents(found, "jobs") == {("team", "train"): ["b"], ("team", "other"): ["a"]}
    assert contents(found, "nodes") == {"n2": ["a"]}
    found.apply("DELETED", found.prepare(pod("a", "other", node="n2")))
    found.apply("DELETED", found.prepare(pod("b", "train")))
    assert contents(found, "jobs") == contents(found, "nodes") == {}
    assert len(found) == 0


def test_an_object_no_index_function_keeps_is_still_held_for_the_next_listing() -> None:
    found = indexer()
    found.apply("ADDED", found.prepare(pod("a", None)))
    assert contents(found, "jobs") == {}
    assert [c.type for c in found.relist([])] == ["DELETED"]


def test_a_listing_drops_what_it_no_longer_shows_and_tells_of_each_as_deleted() -> None:
    found = indexer()
    for name in ("a", "b", "c"):
        found.apply("ADDED", found.prepare(pod(name, "train", node=f"n-{name}")))
    changes = found.relist([found.prepare(pod("b", "train", node="n-b"))])
    assert contents(found, "jobs") == {("team", "train"): ["b"]}
    assert contents(found, "nodes") == {"n-b": ["b"]}
    assert [(c.type, object_key(c.body)) for c in changes] == [
        (None, ("team", "b")),
        ("DELETED", ("team", "a")),
        ("DELETED", ("team", "c")),
    ]
    # A deleted object's stub is what a handler reads of it: labels and node selector.
    gone = next(c.body for c in changes if c.type == "DELETED")
    assert gone == stub(pod("a", "train", node="n-a"))
    assert gone["metadata"]["labels"] == {"job": "train"}
    assert gone["spec"] == {"nodeSelector": {"pool": "p"}}


def test_a_listing_of_one_namespace_leaves_the_other_namespaces_objects_alone() -> None:
    found = indexer()
    found.apply("ADDED", found.prepare(pod("a", "train", namespace="team-a")))
    found.apply("ADDED", found.prepare(pod("b", "train", namespace="team-b")))
    changes = found.relist([], namespace="team-a")
    assert [(c.type, object_key(c.body)) for c in changes] == [("DELETED", ("team-a", "a"))]
    assert contents(found, "jobs") == {("team-b", "train"): ["b"]}


def test_a_stub_keeps_no_more_than_the_metadata_a_handler_reads() -> None:
    raw = pod("a", "train")
    raw["metadata"]["annotations"] = {"big": "x" * 10_000}
    raw["spec"]["containers"] = [{"name": "c"}]
    kept = stub(raw)
    assert set(kept["metadata"]) == {"name", "namespace", "uid", "labels"}
    assert set(kept) == {"metadata", "spec"}
    assert stub({"metadata": {"name": "node-1"}}) == {"metadata": {"name": "node-1"}}
