"""The indexes kept of one watched kind of object, fed one event or one listing at a time.

An index function turns an object into the entries it puts in one index (key -> value; none
when the object does not belong there). An `Indexer` runs every index function of its kind on
an object once (`prepare`, which may run in any thread) and applies the result (`apply`), or
the outcome of a whole listing (`relist`): what the listing no longer shows was deleted while
no watch ran, and goes as if a DELETED event had been seen. Each object also leaves a stub of
itself (its metadata and node selector), all a handler reads of an object that went.

An `Index` is a read-only mapping from a key to the values of the objects under it, the shape
`tpujob.kube.cache.CachedView` reads. Pure: `tpujob.kube.informer` lists and watches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any

# The watch's name for an event of an object deleted (the others: ADDED, MODIFIED).
DELETED = "DELETED"
IndexFunction = Callable[[Mapping[str, Any]], Mapping[Hashable, Any]]
ObjectKey = tuple[str, str]  # (namespace, or "" for a cluster-scoped object; name)


def object_key(raw: Mapping[str, Any]) -> ObjectKey:
    meta = raw.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def stub(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of an object besides its index entries: what an event handler reads of
    one that was deleted while no watch ran (the listing that shows it gone has no body)."""
    meta = raw.get("metadata") or {}
    kept: dict[str, Any] = {
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "labels") if k in meta}
    }
    selector = (raw.get("spec") or {}).get("nodeSelector")
    if selector:
        kept["spec"] = {"nodeSelector": selector}
    return kept


class Index(Mapping[Hashable, ValuesView[Any]]):
    """Key -> the values the objects under it put there (an object puts at most one)."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, dict[ObjectKey, Any]] = {}

    def __getitem__(self, key: Hashable) -> ValuesView[Any]:
        return self._entries[key].values()

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, obj: ObjectKey, key: Hashable, value: Any) -> None:
        self._entries.setdefault(key, {})[obj] = value

    def _drop(self, obj: ObjectKey, key: Hashable) -> None:
        found = self._entries.get(key)
        if found is not None:
            found.pop(obj, None)
            if not found:
                del self._entries[key]


@dataclass(frozen=True)
class Prepared:
    """One object as its indexes keep it (each index's entries, and its stub), and the whole
    body, for the handler told of it (not kept)."""

    key: ObjectKey
    entries: tuple[Mapping[Hashable, Any], ...]
    stub: Mapping[str, Any]
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Change:
    """What an applied event or listing did to one object: `type` as the watch names it
    (ADDED, MODIFIED, DELETED; None for an object a listing showed), and the object, or the
    stub of one that went."""

    type: str | None
    body: Mapping[str, Any]


class Indexer:
    """The indexes of one kind, named as their functions; changed in one thread only."""

    def __init__(self, functions: Mapping[str, IndexFunction]) -> None:
        self._functions = tuple(functions.values())
        self.indexes: dict[str, Index] = {name: Index() for name in functions}
        self._held: dict[ObjectKey, tuple[tuple[tuple[Hashable, ...], ...], Mapping[str, Any]]]
        self._held = {}

    def __len__(self) -> int:
        return len(self._held)

    def prepare(self, raw: Mapping[str, Any]) -> Prepared:
        """Run every index function on `raw` (the costly part: any thread may do it)."""
        return Prepared(
            key=object_key(raw),
            entries=tuple(dict(fn(raw)) for fn in self._functions),
            stub=stub(raw),
            body=raw,
        )

    def _remove(self, obj: ObjectKey) -> Mapping[str, Any] | None:
        held = self._held.pop(obj, None)
        if held is None:
            return None
        for index, keys in zip(self.indexes.values(), held[0], strict=True):
            for key in keys:
                index._drop(obj, key)
        return held[1]

    def _add(self, prepared: Prepared) -> None:
        for index, entries in zip(self.indexes.values(), prepared.entries, strict=True):
            for key, value in entries.items():
                index._put(prepared.key, key, value)
        keys = tuple(tuple(entries) for entries in prepared.entries)
        self._held[prepared.key] = (keys, prepared.stub)

    def apply(self, type: str | None, prepared: Prepared) -> None:
        """One watch event's object, prepared."""
        self._remove(prepared.key)
        if type != DELETED:
            self._add(prepared)

    def relist(self, listed: Iterable[Prepared], namespace: str | None = None) -> list[Change]:
        """A whole listing (of `namespace` alone, if given): every object it shows, and the
        stubs of the objects it no longer shows, as DELETED."""
        changes: list[Change] = []
        seen: set[ObjectKey] = set()
        for prepared in listed:
            self._remove(prepared.key)
            self._add(prepared)
            seen.add(prepared.key)
            changes.append(Change(None, prepared.body))
        within = [obj for obj in self._held if namespace is None or obj[0] == namespace]
        for obj in [obj for obj in within if obj not in seen]:
            gone = self._remove(obj)
            if gone is not None:
                changes.append(Change(DELETED, gone))
        return changes
