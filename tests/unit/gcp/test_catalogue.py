"""GKE shapes in the catalogue's names, where they are offered, and the advice it gives."""

from __future__ import annotations

import pytest

from tpujob.gcp.catalogue import (
    Catalogue,
    CatalogueName,
    FindingLevel,
    Offer,
    ZoneProblem,
    catalogue_name,
    check_shape,
    pool_advice,
    zones_offering,
)


@pytest.mark.parametrize(
    ("accelerator", "topology", "expected"),
    [
        ("tpu-v5-lite-podslice", "4x4", CatalogueName("v5litepod-16", "V5LITE_POD", "4x4")),
        ("tpu-v5-lite-podslice", "2x2", CatalogueName("v5litepod-4", "V5LITE_POD", "2x2")),
        ("tpu-v4-podslice", "2x2x2", CatalogueName("v4-16", "V4", "2x2x2")),
        ("tpu-v5p-slice", "2x2x2", CatalogueName("v5p-16", "V5P", "2x2x2")),
        ("tpu-v6e-slice", "4x4", CatalogueName("v6e-16", "V6E", "4x4")),
        ("tpu7x", "2x2x1", None),  # not in the catalogue's generations
        ("tpu-v5-lite-podslice", "3x3", None),  # not a GKE topology
        ("gpu-h100", "4x4", None),
    ],
)
def test_gke_labels_map_to_catalogue_names(
    accelerator: str, topology: str, expected: CatalogueName | None
) -> None:
    assert catalogue_name(accelerator, topology) == expected


V5E_16 = Offer("v5litepod-16", frozenset({("V5LITE_POD", "4x4")}))
V6E_16 = Offer("v6e-16", frozenset({("V6E", "4x4")}))
CATALOGUE = Catalogue(
    project="p",
    offers={
        "us-west4-a": (V5E_16,),
        "us-east5-b": (V5E_16, V6E_16),
        "europe-west4-a": (V6E_16,),
        "asia-1": (Offer("v5litepod-16"),),
    },
)


def test_zones_offering_matches_config_or_bare_type_name() -> None:
    assert zones_offering(CATALOGUE, "tpu-v5-lite-podslice", "4x4") == (
        "asia-1",
        "us-east5-b",
        "us-west4-a",
    )
    assert zones_offering(CATALOGUE, "tpu-v5p-slice", "2x2x2") == ()


@pytest.mark.parametrize(
    ("case", "catalogue", "shape", "level", "says"),
    [
        ("offered", CATALOGUE, ("tpu-v6e-slice", "4x4"), FindingLevel.OK, "europe-west4-a"),
        (
            "offered nowhere",
            CATALOGUE,
            ("tpu-v5p-slice", "2x2x2"),
            FindingLevel.WARNING,
            "v5p-16 (tpu-v5p-slice 2x2x2) is offered in none of the zones",
        ),
        ("newer generation", CATALOGUE, ("tpu7x", "2x2x1"), FindingLevel.INFO, "not checked"),
        ("no catalogue", None, ("tpu-v6e-slice", "4x4"), FindingLevel.INFO, "no zone catalogue"),
        (
            "every zone unreadable",
            Catalogue(project="p", problems={"z": (ZoneProblem.UNREACHABLE, "timeout")}),
            ("tpu-v6e-slice", "4x4"),
            FindingLevel.INFO,
            "could not be read",
        ),
    ],
)
def test_check_shape(
    case: str, catalogue: Catalogue | None, shape: tuple[str, str], level: FindingLevel, says: str
) -> None:
    check = check_shape(catalogue, *shape)
    assert check.level is level, case
    assert says in check.message, case


@pytest.mark.parametrize(
    ("catalogue", "accelerator", "topology", "limit", "expected"),
    [
        (
            CATALOGUE,
            "tpu-v5-lite-podslice",
            "4x4",
            3,
            "no free tpu-v5-lite-podslice 4x4 pool is left: create a v5litepod-16 pool in "
            "asia-1, us-east5-b, us-west4-a",
        ),
        (
            CATALOGUE,
            "tpu-v5-lite-podslice",
            "4x4",
            1,
            "no free tpu-v5-lite-podslice 4x4 pool is left: create a v5litepod-16 pool in "
            "asia-1 (and 2 more)",
        ),
        (CATALOGUE, "tpu-v5p-slice", "2x2x2", 3, None),
        (None, "tpu-v6e-slice", "4x4", 3, None),
        (CATALOGUE, "tpu7x", "2x2x1", 3, None),
    ],
)
def test_pool_advice(
    catalogue: Catalogue | None, accelerator: str, topology: str, limit: int, expected: str | None
) -> None:
    assert pool_advice(catalogue, accelerator, topology, limit=limit) == expected
