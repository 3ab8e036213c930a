"""Which node pool each slice of a job runs on.

Pure. A slice is the unit of placement (GKE repairs a multi-host slice as a whole, so a slice
moves to another pool rather than to another node). A pool is usable when it has the job's
accelerator and topology, exactly one healthy node per host of the slice, and no node the job
has blamed. Pools free of other TPU work come first, then the others, each in name order, so
the choice is deterministic for the same cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tpujob.api.attempt import AttemptStatus, SlicePlacement
from tpujob.observed import NodeView


@dataclass(frozen=True)
class PoolHealth:
    name: str
    nodes: tuple[NodeView, ...]

    def usable(self, hosts: int, bad_nodes: frozenset[str]) -> bool:
        return len(self.nodes) >= hosts and all(n.healthy_for(bad_nodes) for n in self.nodes)


def pools_for(nodes: Iterable[NodeView], accelerator: str, topology: str) -> list[PoolHealth]:
    grouped: dict[str, list[NodeView]] = defaultdict(list)
    for node in nodes:
        if node.pool and node.accelerator == accelerator and node.topology == topology:
            grouped[node.pool].append(node)
    return [PoolHealth(name, tuple(sorted(members, key=lambda n: n.name)))
            for name, members in sorted(grouped.items())]


def place_slices(
    *,
    slices: int,
    hosts_per_slice: int,
    accelerator: str,
    topology: str,
    nodes: Iterable[NodeView],
    keep: Mapping[int, str],
    bad_nodes: frozenset[str],
    busy_pools: frozenset[str] = frozenset(),
) -> dict[int, str]:
    """Pools for every slice: those in `keep` stay; the others get usable free pools.

    Slices that cannot be placed are left out of the result; their pods then wait with only
    the accelerator/topology selector, and the scheduler's message says why.
    """
    result = dict(keep)
    taken = set(keep.values())
    pools = [p for p in pools_for(nodes, accelerator, topology)
             if p.name not in taken and p.usable(hosts_per_slice, bad_nodes)]
    ordered = [p for p in pools if p.name not in busy_pools] + \
              [p for p in pools if p.name in busy_pools]
    for index in range(slices):
        if index in result:
            continue
        if not ordered:
            break
        result[index] = ordered.pop(0).name
    return result


def broken_slices(pools: Mapping[int, str], nodes: Mapping[str, NodeView],
                  bad_nodes: frozenset[str]) -> set[int]:
    """Slices whose pool now has a node the job must not use."""
    by_pool: dict[str, list[NodeView]] = defaultdict(list)
    for node in nodes.values():
        if node.pool:
            by_pool[node.pool].append(node)
    return {index for index, pool in pools.items()
            if any(not n.healthy_for(bad_nodes) for n in by_pool.get(pool, []))}


def pools_of(attempt: AttemptStatus) -> dict[int, str]:
    """The recorded pool of each slice of an attempt."""
    return {p.slice: p.node_pool for p in attempt.placement}


def placement(pools: Mapping[int, str]) -> tuple[SlicePlacement, ...]:
    """Pools per slice as the status records them."""
    return tuple(SlicePlacement(slice=s, node_pool=p) for s, p in sorted(pools.items()))
