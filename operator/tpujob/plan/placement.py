"""Which node pool each slice of a job runs on.

Pure. A slice is the unit of placement (GKE repairs a multi-host slice as a whole, so a slice
moves to another pool rather than to another node). A pool is usable when it has the job's
accelerator and topology, exactly one healthy node per host of the slice, and no node the job
has blamed. Pools are ranked by an ordered table (`RANKS`): the job's own warm spares first
(`tpujob.plan.spares`), then free pools, then pools busy with other TPU work, then pools with
GKE host maintenance scheduled within the job's expected run (a slice moved there would be
interrupted again); name order breaks ties, so the choice is
deterministic for the same cluster. Every pool placed with a caveat comes with a `PoolNote`
the placement Event can show.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum

from tpujob.api.attempt import AttemptStatus, SlicePlacement
from tpujob.observed.nodes import placeable
from tpujob.observed.views import NodeView

# How far ahead a job with no measured pace is assumed to run.
DEFAULT_RUN_HORIZON = timedelta(hours=24)
# The furthest `expected_end` looks ahead, however slow the measured pace.
MAX_RUN_AHEAD = timedelta(days=365)


@dataclass(frozen=True)
class PoolHealth:
    name: str
    nodes: tuple[NodeView, ...]

    def usable(self, hosts: int, bad_nodes: frozenset[str]) -> bool:
        return len(self.nodes) >= hosts and all(placeable(n, bad_nodes) for n in self.nodes)


def pools_for(nodes: Iterable[NodeView], accelerator: str, topology: str) -> list[PoolHealth]:
    grouped: dict[str, list[NodeView]] = defaultdict(list)
    for node in nodes:
        if node.pool and node.accelerator == accelerator and node.topology == topology:
            grouped[node.pool].append(node)
    return [
        PoolHealth(name, tuple(sorted(members, key=lambda n: n.name)))
        for name, members in sorted(grouped.items())
    ]


class PoolRank(IntEnum):
    """Why a pool is where it is in the order; lower is placed first."""

    SPARE = -1  # a warm spare the job holds for this
    FREE = 0
    BUSY = 1  # other jobs' pods request TPUs there
    MAINTENANCE_DUE = 2  # a node has host maintenance scheduled within the expected run


@dataclass(frozen=True)
class PoolNote:
    """A caveat on a placed pool, for the placement Event."""

    slice: int
    pool: str
    rank: PoolRank
    detail: str

    def __str__(self) -> str:
        return f"slice {self.slice} -> {self.pool}: {self.detail}"


@dataclass(frozen=True)
class PlacementResult:
    pools: dict[int, str]
    notes: tuple[PoolNote, ...] = ()
    unplaced: tuple[int, ...] = ()  # slices no usable pool was left for
    # Usable pools left unused because maintenance is due there: (pool, why).
    deferred: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """The caveats in one line for the placement Event ("" when there are none)."""
        parts = [str(n) for n in self.notes] + [
            f"{pool} placed last: {why}" for pool, why in self.deferred
        ]
        return "; ".join(parts)


@dataclass(frozen=True)
class _Context:
    busy_pools: frozenset[str]
    spare_pools: frozenset[str]
    now: datetime | None
    run_until: datetime | None


def maintenance_time(node: NodeView) -> tuple[datetime | None, bool]:
    """(start, readable) of the node's scheduled maintenance; (None, True) when none is set."""
    raw = node.scheduled_maintenance
    if raw is None:
        return None, True
    try:
        return datetime.fromtimestamp(int(raw), tz=UTC), True
    except (ValueError, OverflowError, OSError):
        return None, False


def _maintenance_due(pool: PoolHealth, ctx: _Context) -> str | None:
    if ctx.now is None or ctx.run_until is None:
        return None
    for node in pool.nodes:
        start, readable = maintenance_time(node)
        if not readable:
            # An unreadable notice is still a notice: assume it falls within the run.
            return (
                f"node {node.name} has an unreadable scheduled-maintenance-time "
                f"({node.scheduled_maintenance!r})"
            )
        if start is not None and start <= ctx.run_until:
            when = start.strftime("%Y-%m-%dT%H:%MZ")
            return (
                f"node {node.name} has host maintenance scheduled at {when}, "
                f"within the job's expected run (until {ctx.run_until:%Y-%m-%dT%H:%MZ})"
            )
    return None


def _spare(pool: PoolHealth, ctx: _Context) -> str | None:
    return "a warm spare the job held" if pool.name in ctx.spare_pools else None


def _busy(pool: PoolHealth, ctx: _Context) -> str | None:
    return "other jobs use TPUs in this pool" if pool.name in ctx.busy_pools else None


# Ordered, worst last: a pool takes the rank of the last rule that matches; FREE is the default.
RANKS: tuple[tuple[PoolRank, Callable[[PoolHealth, _Context], str | None]], ...] = (
    (PoolRank.SPARE, _spare),
    (PoolRank.BUSY, _busy),
    (PoolRank.MAINTENANCE_DUE, _maintenance_due),
)
DEFAULT_RANK = PoolRank.FREE


def rank_pool(pool: PoolHealth, ctx: _Context) -> tuple[PoolRank, str]:
    rank, detail = DEFAULT_RANK, ""
    for candidate, rule in RANKS:
        found = rule(pool, ctx)
        if found is not None:
            rank, detail = candidate, found
    return rank, detail


def expected_end(
    now: datetime,
    *,
    step: int | None,
    total_steps: int | None,
    steps_per_second: float | None,
    horizon: timedelta = DEFAULT_RUN_HORIZON,
) -> datetime:
    """When the job should finish at its measured pace, or `now + horizon` without one."""
    if step is None or not total_steps or not steps_per_second or steps_per_second <= 0:
        return now + horizon
    left = max(0, total_steps - step) / steps_per_second
    # The pace (the status's or the heartbeat's) may be any tiny positive number: the seconds
    # are capped before they make a timedelta, which overflows past 999999999 days.
    return now + timedelta(seconds=min(left, MAX_RUN_AHEAD.total_seconds()))


def plan_placement(
    *,
    slices: int,
    hosts_per_slice: int,
    accelerator: str,
    topology: str,
    nodes: Iterable[NodeView],
    keep: Mapping[int, str],
    bad_nodes: frozenset[str],
    busy_pools: frozenset[str] = frozenset(),
    spare_pools: frozenset[str] = frozenset(),
    now: datetime | None = None,
    run_until: datetime | None = None,
) -> PlacementResult:
    """Pools for every slice: those in `keep` stay; the others get the best usable pools.

    Maintenance is weighed only when `now` and `run_until` (see `expected_end`) are given.
    Slices that cannot be placed are listed in `unplaced`; their pods then wait with only the
    accelerator/topology selector, and the scheduler's message says why.
    """
    ctx = _Context(busy_pools, spare_pools, now, run_until)
    result = dict(keep)
    taken = set(keep.values())
    # Ranked first, and each pool's nodes judged only when its turn comes: a job takes a few
    # pools of hundreds, and judging every node of every pool at each plan was most of it.
    ranked = iter(
        sorted(
            (
                (rank_pool(p, ctx), p)
                for p in pools_for(nodes, accelerator, topology)
                if p.name not in taken
            ),
            key=lambda item: (item[0][0], item[1].name),
        )
    )
    usable = ((found, p.name) for found, p in ranked if p.usable(hosts_per_slice, bad_nodes))
    notes: list[PoolNote] = []
    unplaced: list[int] = []
    for index in range(slices):
        if index in result:
            continue
        chosen = next(usable, None)
        if chosen is None:
            unplaced.append(index)
            continue
        (rank, detail), name = chosen
        result[index] = name
        if rank is PoolRank.MAINTENANCE_DUE:
            notes.append(PoolNote(index, name, rank, detail + "; no better pool was free"))
    deferred = tuple(
        (p.name, detail)
        for (rank, detail), p in ranked
        if rank is PoolRank.MAINTENANCE_DUE
        and len(result) > len(keep)
        and p.usable(hosts_per_slice, bad_nodes)
    )
    return PlacementResult(result, tuple(notes), tuple(unplaced), deferred)


def pools_of(attempt: AttemptStatus) -> dict[int, str]:
    """The recorded pool of each slice of an attempt."""
    return {p.slice: p.node_pool for p in attempt.placement}


def placement(pools: Mapping[int, str]) -> tuple[SlicePlacement, ...]:
    """Pools per slice as the status records them."""
    return tuple(SlicePlacement(slice=s, node_pool=p) for s, p in sorted(pools.items()))
