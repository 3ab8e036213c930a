"""Ghosts: objects the watch-fed indexes still hold after the cluster lost them.

kopf, which feeds the jobs' index, drops an object from it only on a DELETED event. When a
watch breaks for longer than the apiserver keeps events (an apiserver restart, a control-plane
upgrade, a partition), kopf lists again and carries on, but sends nothing for the objects that
went meanwhile: their index entries stay for good. The operator's own informers (pods, nodes,
Leases: `tpujob.kube.informer`) drop what a new listing no longer shows, but the check covers
them as well: a ghost pod blocks its job's next attempt (its delete finds nothing, yet it never
leaves the cache), ghost pods and nodes keep pools busy, and a ghost node looks placeable.

So the operator lists the uids of what it caches every so often and compares. An object the
list does not show may simply be newer than the list (the watch can run ahead of a list served
from the apiserver's cache), so only one missing from two lists in a row is a ghost; one that
shows again, or leaves the indexes, stops being one. Pure: the caller lists.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field


@dataclass
class GhostFinder:
    """The ghosts of one kind of object, from what the cache holds and what lists show."""

    ghosts: frozenset[str] = frozenset()
    _missing_once: frozenset[str] = field(default=frozenset(), repr=False)

    def compare(self, cached: Iterable[str], listed: Collection[str]) -> frozenset[str]:
        """Note one list: `cached` the uids the indexes hold now, `listed` the uids the list
        showed. Returns the ghosts: cached, and missing from this list and the one before."""
        missing = frozenset(uid for uid in cached if uid and uid not in listed)
        self.ghosts = missing & self._missing_once
        self._missing_once = missing
        return self.ghosts


@dataclass
class Ghosts:
    """The ghost uids the cached view leaves out, one finder per kind of object. Changed only
    in the event loop (by the sweep), read there by the reconciles' reads."""

    pods: GhostFinder = field(default_factory=GhostFinder)
    nodes: GhostFinder = field(default_factory=GhostFinder)
    jobs: GhostFinder = field(default_factory=GhostFinder)

    @property
    def any(self) -> bool:
        return bool(self.pods.ghosts or self.nodes.ghosts or self.jobs.ghosts)
