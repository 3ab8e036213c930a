"""The zone catalogue as values, and what it says about a job's shape. Pure.

The Cloud TPU API names a shape by type (`v5litepod-16`) and by an accelerator config
(generation enum `V5LITE_POD`, topology `4x4`); GKE names it by the node labels
`cloud.google.com/gke-tpu-accelerator` and `cloud.google.com/gke-tpu-topology`. `GENERATIONS`
is the one table between the two; the type name comes from `tpujob.api.topology`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tpujob.api import topology
from tpujob.api.topology import Generation

# tpujob generation -> the Cloud TPU API's AcceleratorConfig.Type name. A generation missing
# here (tpu7x) is not in the catalogue's enum: the catalogue says nothing about it.
GENERATIONS: Mapping[Generation, str] = {
    Generation.V4: "V4",
    Generation.V5E: "V5LITE_POD",
    Generation.V5P: "V5P",
    Generation.V6E: "V6E",
}


@dataclass(frozen=True)
class Offer:
    """One accelerator type a zone offers: its name and each (generation, topology) config."""

    type_name: str
    configs: frozenset[tuple[str, str]] = frozenset()


class ZoneProblem(StrEnum):
    """Why a zone's offers are unknown."""

    PERMISSION_DENIED = "PermissionDenied"  # 403: the API is off or the caller may not list
    NOT_FOUND = "NotFound"  # 404: no such project or zone
    UNREACHABLE = "Unreachable"  # no answer (network, DNS, timeout)
    BAD_ANSWER = "BadAnswer"  # an answer that is not a catalogue


@dataclass(frozen=True)
class Catalogue:
    """What each zone offers; zones that could not be read are in `problems` instead."""

    project: str
    offers: Mapping[str, tuple[Offer, ...]] = field(default_factory=dict)
    problems: Mapping[str, tuple[ZoneProblem, str]] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return bool(self.offers)


@dataclass(frozen=True)
class CatalogueName:
    """A GKE shape in the catalogue's terms."""

    type_name: str  # e.g. v5litepod-16
    generation: str  # e.g. V5LITE_POD
    topology: str  # e.g. 4x4


def catalogue_name(accelerator: str, topo: str) -> CatalogueName | None:
    """The catalogue's name for a GKE accelerator label and topology; None when it has none."""
    try:
        shape = topology.resolve(accelerator, topo)
    except topology.TopologyError:
        return None
    generation = GENERATIONS.get(shape.generation)
    if generation is None:
        return None
    return CatalogueName(shape.tpu_type, generation, topo)


def zones_offering(catalogue: Catalogue, accelerator: str, topo: str) -> tuple[str, ...] | None:
    """The zones that offer the shape, sorted; None when the catalogue cannot say.

    An offer matches on its accelerator config (generation and topology) or, for entries
    without configs, on its type name.
    """
    name = catalogue_name(accelerator, topo)
    if name is None or not catalogue.usable:
        return None
    wanted = (name.generation, name.topology)
    return tuple(
        sorted(
            zone
            for zone, offers in catalogue.offers.items()
            if any(
                wanted in o.configs or (not o.configs and o.type_name == name.type_name)
                for o in offers
            )
        )
    )


class FindingLevel(StrEnum):
    OK = "ok"
    INFO = "info"
    WARNING = "warning"


@dataclass(frozen=True)
class ShapeCheck:
    level: FindingLevel
    message: str


def check_shape(catalogue: Catalogue | None, accelerator: str, topo: str) -> ShapeCheck:
    """Whether any configured zone offers the job's shape, as a one-line finding."""
    if catalogue is None:
        return ShapeCheck(FindingLevel.INFO, "no zone catalogue configured")
    name = catalogue_name(accelerator, topo)
    if name is None:
        return ShapeCheck(
            FindingLevel.INFO, f"{accelerator} {topo} has no Cloud TPU catalogue name; not checked"
        )
    zones = zones_offering(catalogue, accelerator, topo)
    if zones is None:
        return ShapeCheck(FindingLevel.INFO, "the zone catalogue could not be read; not checked")
    if zones:
        return ShapeCheck(
            FindingLevel.OK, f"{name.type_name} ({topo}) is offered in {', '.join(zones)}"
        )
    checked = ", ".join(sorted(catalogue.offers))
    return ShapeCheck(
        FindingLevel.WARNING,
        f"{name.type_name} ({accelerator} {topo}) is offered in none of the "
        f"zones {checked}; a pool for it may not be creatable there",
    )


def pool_advice(
    catalogue: Catalogue | None, accelerator: str, topo: str, *, limit: int = 3
) -> str | None:
    """Advice for a hard failure that found no free pool of the job's shape, or None."""
    if catalogue is None:
        return None
    name = catalogue_name(accelerator, topo)
    zones = zones_offering(catalogue, accelerator, topo)
    if name is None or not zones:
        return None
    shown = ", ".join(zones[:limit]) + (
        f" (and {len(zones) - limit} more)" if len(zones) > limit else ""
    )
    return f"no free {accelerator} {topo} pool is left: create a {name.type_name} pool in {shown}"
