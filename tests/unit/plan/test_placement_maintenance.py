"""Pools with host maintenance due within the job's run are placed last, and say why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tpujob.api import labels
from tpujob.observed.views import NodeView
from tpujob.plan.placement import PoolRank, expected_end, maintenance_time, plan_placement

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def pool_nodes(pool: str, *, maintenance: str | None = None, hosts: int = 2) -> list[NodeView]:
    extra = {labels.SCHEDULED_MAINTENANCE_LABEL: maintenance} if maintenance else {}
    return [
        NodeView(
            name=f"{pool}-w{h}",
            pool=pool,
            accelerator="tpu-v5-lite-podslice",
            topology="4x4",
            ready="True",
            tpu_capacity=4,
            tpu_allocatable=4,
            labels={labels.NODEPOOL: pool, **(extra if h == 0 else {})},
        )
        for h in range(hosts)
    ]


def epoch(delta: timedelta) -> str:
    return str(int((NOW + delta).timestamp()))


def place(
    nodes: list[NodeView],
    *,
    slices: int = 1,
    busy: frozenset[str] = frozenset(),
    run: timedelta | None = timedelta(hours=2),
) -> tuple[dict[int, str], str]:
    result = plan_placement(
        slices=slices,
        hosts_per_slice=2,
        accelerator="tpu-v5-lite-podslice",
        topology="4x4",
        nodes=nodes,
        keep={},
        bad_nodes=frozenset(),
        busy_pools=busy,
        now=NOW if run is not None else None,
        run_until=NOW + run if run is not None else None,
    )
    return result.pools, result.describe()


@pytest.mark.parametrize(
    ("case", "nodes", "busy", "expected", "says"),
    [
        (
            "maintenance in an hour puts the pool after a free one",
            pool_nodes("a", maintenance=epoch(timedelta(hours=1))) + pool_nodes("b"),
            frozenset(),
            {0: "b"},
            "a placed last: node a-w0 has host maintenance scheduled",
        ),
        (
            "maintenance after the run ends does not matter",
            pool_nodes("a", maintenance=epoch(timedelta(hours=5))) + pool_nodes("b"),
            frozenset(),
            {0: "a"},
            "",
        ),
        (
            "maintenance ranks below a busy pool",
            pool_nodes("a", maintenance=epoch(timedelta(minutes=5))) + pool_nodes("b"),
            frozenset({"b"}),
            {0: "b"},
            "a placed last",
        ),
        (
            "a due pool is still used when nothing else is usable",
            pool_nodes("a", maintenance=epoch(timedelta(minutes=5))),
            frozenset(),
            {0: "a"},
            "slice 0 -> a: node a-w0 has host maintenance scheduled",
        ),
        (
            "an unreadable notice is taken as due",
            pool_nodes("a", maintenance="next-tuesday") + pool_nodes("b"),
            frozenset(),
            {0: "b"},
            "unreadable scheduled-maintenance-time",
        ),
        (
            "maintenance already past its start is due",
            pool_nodes("a", maintenance=epoch(-timedelta(minutes=5))) + pool_nodes("b"),
            frozenset(),
            {0: "b"},
            "a placed last",
        ),
    ],
)
def test_maintenance_ordering(
    case: str, nodes: list[NodeView], busy: frozenset[str], expected: dict[int, str], says: str
) -> None:
    pools, described = place(nodes, busy=busy)
    assert pools == expected, case
    assert says in described if says else described == "", case


def test_without_a_clock_maintenance_is_not_weighed() -> None:
    nodes = pool_nodes("a", maintenance=epoch(timedelta(minutes=5))) + pool_nodes("b")
    assert place(nodes, run=None) == ({0: "a"}, "")


def test_two_slices_take_the_free_pools_before_the_due_one() -> None:
    nodes = (
        pool_nodes("a", maintenance=epoch(timedelta(minutes=5))) + pool_nodes("b") + pool_nodes("c")
    )
    result = plan_placement(
        slices=2,
        hosts_per_slice=2,
        accelerator="tpu-v5-lite-podslice",
        topology="4x4",
        nodes=nodes,
        keep={},
        bad_nodes=frozenset(),
        now=NOW,
        run_until=NOW + timedelta(hours=1),
    )
    assert result.pools == {0: "b", 1: "c"}
    assert [pool for pool, _ in result.deferred] == ["a"]
    assert result.notes == ()


def test_a_due_pool_used_carries_its_rank() -> None:
    result = plan_placement(
        slices=1,
        hosts_per_slice=2,
        accelerator="tpu-v5-lite-podslice",
        topology="4x4",
        nodes=pool_nodes("a", maintenance=epoch(timedelta(minutes=1))),
        keep={},
        bad_nodes=frozenset(),
        now=NOW,
        run_until=NOW + timedelta(hours=1),
    )
    assert [(n.slice, n.pool, n.rank) for n in result.notes] == [(0, "a", PoolRank.MAINTENANCE_DUE)]


def test_slices_with_no_pool_left_are_reported_unplaced() -> None:
    result = plan_placement(
        slices=2,
        hosts_per_slice=2,
        accelerator="tpu-v5-lite-podslice",
        topology="4x4",
        nodes=pool_nodes("a"),
        keep={},
        bad_nodes=frozenset(),
    )
    assert result.pools == {0: "a"}
    assert result.unplaced == (1,)


@pytest.mark.parametrize(
    ("case", "step", "total", "rate", "expected"),
    [
        ("measured pace", 100, 1100, 2.0, timedelta(seconds=500)),
        ("finished", 1100, 1100, 2.0, timedelta(0)),
        ("no pace yet uses the horizon", None, 1100, None, timedelta(hours=24)),
        ("zero rate uses the horizon", 10, 1100, 0.0, timedelta(hours=24)),
    ],
)
def test_expected_end(
    case: str, step: int | None, total: int, rate: float | None, expected: timedelta
) -> None:
    assert (
        expected_end(NOW, step=step, total_steps=total, steps_per_second=rate) == NOW + expected
    ), case


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, (None, True)),
        ("1767268800", (datetime(2026, 1, 1, 12, 0, tzinfo=UTC), True)),
        ("soon", (None, False)),
        ("9" * 40, (None, False)),
    ],
)
def test_maintenance_time_parses_unix_seconds(
    value: str | None, expected: tuple[datetime | None, bool]
) -> None:
    node = NodeView(
        name="n",
        pool="p",
        accelerator=None,
        topology=None,
        ready="True",
        labels={labels.SCHEDULED_MAINTENANCE_LABEL: value} if value else {},
    )
    assert maintenance_time(node) == expected
