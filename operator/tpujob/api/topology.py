"""The TPU accelerator and topology table, and pure functions over it.

Bottom layer (stdlib only). Every place that needs to know what a slice looks like reads it
from here: the API models (hosts and chips per host are derived, never typed by users), the
CRD generator (the CEL admission rules are generated from this table) and the operator (how
many pods a slice needs and how many chips each requests).

A "host" is a GKE node, i.e. one TPU VM. Multi-host GKE TPU VMs carry 4 chips, so a multi-host
slice has chips / 4 hosts. Cloud TPU documentation counts 8-chip hosts for v5e/v6e; GKE does
not, and this table follows GKE because GKE nodes are what the operator schedules onto.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class Generation(enum.StrEnum):
    """TPU hardware generations the operator knows how to schedule."""

    V4 = "v4"
    V5E = "v5e"
    V5P = "v5p"
    V6E = "v6e"
    TPU7X = "tpu7x"


class TopologyError(ValueError):
    """An accelerator/topology pair that is not in the table."""


class UnknownAcceleratorError(TopologyError):
    """The accelerator label is not one this operator knows."""

    def __init__(self, accelerator: str) -> None:
        self.accelerator = accelerator
        super().__init__(
            f"unknown accelerator {accelerator!r}; supported: {', '.join(accelerator_labels())}"
        )


class UnsupportedTopologyError(TopologyError):
    """The topology is not offered for the accelerator."""

    def __init__(self, accelerator: str, topology: str) -> None:
        self.accelerator = accelerator
        self.topology = topology
        allowed = ", ".join(topologies(accelerator))
        super().__init__(
            f"topology {topology!r} is not offered for {accelerator}; supported: {allowed}"
        )


@dataclass(frozen=True)
class Accelerator:
    """One GKE TPU accelerator (the `cloud.google.com/gke-tpu-accelerator` label value)."""

    label: str
    generation: Generation
    tensorcores_per_chip: int
    # Topology -> chips per host. Ordered smallest first, as users read the list in messages.
    chips_per_host: Mapping[str, int]


@dataclass(frozen=True)
class SliceShape:
    """The resolved geometry of one slice: what the operator schedules per slice."""

    accelerator: str
    generation: Generation
    topology: str
    chips: int
    chips_per_host: int
    tensorcores_per_chip: int

    @property
    def hosts(self) -> int:
        """GKE nodes (TPU VMs) in one slice; one worker pod runs on each."""
        return self.chips // self.chips_per_host

    @property
    def multi_host(self) -> bool:
        """Whether the slice spans several VMs; only such slices can form a multislice job."""
        return self.hosts > 1

    @property
    def tpu_type(self) -> str:
        """The Cloud TPU type name, e.g. `v5p-128` (TensorCores) or `v6e-16` (chips)."""
        prefix = {Generation.V5E: "v5litepod"}.get(self.generation, str(self.generation))
        return f"{prefix}-{self.chips * self.tensorcores_per_chip}"


def _four_chip_hosts(*topologies: str) -> Mapping[str, int]:
    return {t: 4 for t in topologies}


# Single-host shapes of the 2D generations use 1-, 4- and 8-chip machine types
# (ct5lp-hightpu-1t/4t/8t, ct6e-standard-1t/4t/8t); 2x4 is taken as the single 8-chip VM,
# which is what GKE provisions for a 2x4 node pool of the 8t machine type.
_LITE_SHAPES: Mapping[str, int] = {
    "1x1": 1,
    "2x2": 4,
    "2x4": 8,
    **_four_chip_hosts("4x4", "4x8", "8x8", "8x16", "16x16"),
}


def _row(
    label: str, generation: Generation, tensorcores_per_chip: int, shapes: Mapping[str, int]
) -> Accelerator:
    return Accelerator(label, generation, tensorcores_per_chip, MappingProxyType(dict(shapes)))


# The 3D generations share their shapes up to 8x8x8 (two cubes per dimension).
_CUBE_SHAPES = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8")

ACCELERATORS: tuple[Accelerator, ...] = (
    _row(
        "tpu-v4-podslice",
        Generation.V4,
        2,
        _four_chip_hosts(*_CUBE_SHAPES, "8x8x12", "8x8x16", "8x16x16"),
    ),
    _row("tpu-v5-lite-podslice", Generation.V5E, 1, _LITE_SHAPES),
    _row(
        "tpu-v5p-slice",
        Generation.V5P,
        2,
        # v5p offers no 2x2x4 slice.
        _four_chip_hosts(
            *(s for s in _CUBE_SHAPES if s != "2x2x4"), "8x8x16", "8x16x16", "16x16x16", "16x16x24"
        ),
    ),
    _row("tpu-v6e-slice", Generation.V6E, 1, _LITE_SHAPES),
    _row("tpu7x", Generation.TPU7X, 2, _four_chip_hosts(*_CUBE_SHAPES, "8x8x16", "8x16x16")),
)

_BY_LABEL: Mapping[str, Accelerator] = MappingProxyType({a.label: a for a in ACCELERATORS})


def accelerator_labels() -> tuple[str, ...]:
    """Every supported accelerator label, in table order."""
    return tuple(a.label for a in ACCELERATORS)


def accelerator(label: str) -> Accelerator:
    """The table row for `label`; raises UnknownAcceleratorError."""
    try:
        return _BY_LABEL[label]
    except KeyError:
        raise UnknownAcceleratorError(label) from None


def topologies(label: str) -> tuple[str, ...]:
    """The topologies offered for an accelerator, smallest first."""
    return tuple(accelerator(label).chips_per_host)


def chip_count(topology: str) -> int:
    """Chips in a topology string such as `4x4x8`; raises TopologyError when malformed."""
    parts = topology.split("x")
    if not all(p.isdigit() and int(p) > 0 for p in parts):
        raise TopologyError(f"malformed topology {topology!r}; expected dimensions like 4x4x8")
    return math.prod(int(p) for p in parts)


def _shape(row: Accelerator, topology: str) -> SliceShape:
    return SliceShape(
        accelerator=row.label,
        generation=row.generation,
        topology=topology,
        chips=chip_count(topology),
        chips_per_host=row.chips_per_host[topology],
        tensorcores_per_chip=row.tensorcores_per_chip,
    )


# Every supported shape, made once: a reconcile asks for its job's shape dozens of times.
_SHAPES: Mapping[tuple[str, str], SliceShape] = MappingProxyType(
    {(a.label, t): _shape(a, t) for a in ACCELERATORS for t in a.chips_per_host}
)


def resolve(label: str, topology: str) -> SliceShape:
    """The slice geometry for an accelerator/topology pair; raises a TopologyError subclass."""
    found = _SHAPES.get((label, topology))
    if found is None:
        accelerator(label)  # an unknown accelerator is named as such
        raise UnsupportedTopologyError(label, topology)
    return found


def all_shapes() -> tuple[SliceShape, ...]:
    """Every supported slice shape, accelerator by accelerator."""
    return tuple(_SHAPES.values())
