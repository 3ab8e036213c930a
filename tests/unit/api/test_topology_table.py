"""The accelerator/topology table: slice geometry derived from the GKE TPU facts."""

from __future__ import annotations

import pytest

from tpujob.api import topology
from tpujob.api.topology import Generation


@pytest.mark.parametrize(
    ("accelerator", "topo", "hosts", "chips_per_host", "tpu_type"),
    [
        ("tpu-v4-podslice", "2x2x1", 1, 4, "v4-8"),
        ("tpu-v4-podslice", "4x4x8", 32, 4, "v4-256"),
        ("tpu-v5-lite-podslice", "1x1", 1, 1, "v5litepod-1"),
        ("tpu-v5-lite-podslice", "2x4", 1, 8, "v5litepod-8"),
        ("tpu-v5-lite-podslice", "4x4", 4, 4, "v5litepod-16"),
        ("tpu-v5-lite-podslice", "16x16", 64, 4, "v5litepod-256"),
        ("tpu-v5p-slice", "4x4x4", 16, 4, "v5p-128"),
        ("tpu-v5p-slice", "16x16x24", 1536, 4, "v5p-12288"),
        ("tpu-v6e-slice", "8x8", 16, 4, "v6e-64"),
        ("tpu7x", "2x2x2", 2, 4, "tpu7x-16"),
    ],
    ids=str,
)
def test_resolve_derives_hosts_and_chips_per_host(
    accelerator: str, topo: str, hosts: int, chips_per_host: int, tpu_type: str
) -> None:
    shape = topology.resolve(accelerator, topo)
    assert (shape.hosts, shape.chips_per_host, shape.tpu_type) == (hosts, chips_per_host, tpu_type)
    assert shape.multi_host is (hosts > 1)


def test_every_shape_fills_whole_hosts() -> None:
    for shape in topology.all_shapes():
        assert shape.chips % shape.chips_per_host == 0, shape
        assert shape.chips_per_host in (1, 4, 8), shape
        # Multi-host GKE TPU VMs always carry four chips.
        assert not shape.multi_host or shape.chips_per_host == 4, shape


def test_every_generation_has_exactly_one_accelerator() -> None:
    assert sorted(a.generation for a in topology.ACCELERATORS) == sorted(Generation)


def test_unknown_accelerator_error_lists_supported_labels() -> None:
    with pytest.raises(topology.UnknownAcceleratorError) as caught:
        topology.resolve("tpu-v3", "2x2")
    assert "tpu-v3" in str(caught.value)
    assert "tpu-v5p-slice" in str(caught.value)


def test_topology_of_another_generation_is_refused_with_the_allowed_list() -> None:
    with pytest.raises(topology.UnsupportedTopologyError) as caught:
        topology.resolve("tpu-v5-lite-podslice", "4x4x4")
    assert caught.value.topology == "4x4x4"
    assert "2x2, 2x4, 4x4" in str(caught.value)


@pytest.mark.parametrize("topo", ["", "4x", "4x-4", "axb", "0x4"], ids=repr)
def test_malformed_topology_has_no_chip_count(topo: str) -> None:
    with pytest.raises(topology.TopologyError):
        topology.chip_count(topo)
