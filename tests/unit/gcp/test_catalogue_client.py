"""The real google-cloud-tpu client reads the catalogue from a local fake of the API."""

from __future__ import annotations

import logging
import socket

import pytest
from tests.unit.gcp.fake_tpu_api import FakeTpuApi, accelerator_type, serve

from tpujob.gcp.catalogue import FindingLevel, Offer, ZoneProblem, check_shape
from tpujob.gcp.client import CatalogueConfig, CatalogueSource, parse_zones, read_catalogue

pytest.importorskip("google.cloud.tpu_v2")


def config(endpoint: str, *zones: str) -> CatalogueConfig:
    return CatalogueConfig(
        project="p", zones=zones, api_endpoint=endpoint, anonymous=True, timeout_seconds=5
    )


def test_every_page_of_a_zone_is_read() -> None:
    api = FakeTpuApi(
        {
            "us-west4-a": [
                [accelerator_type("us-west4-a", "v5litepod-4", "V5LITE_POD", "2x2")],
                [accelerator_type("us-west4-a", "v5litepod-16", "V5LITE_POD", "4x4")],
                [accelerator_type("us-west4-a", "v6e-16", "V6E", "4x4")],
            ]
        }
    )
    with serve(api) as endpoint:
        catalogue = read_catalogue(config(endpoint, "us-west4-a"))
    assert catalogue.problems == {}
    assert [o.type_name for o in catalogue.offers["us-west4-a"]] == [
        "v5litepod-4",
        "v5litepod-16",
        "v6e-16",
    ]
    assert catalogue.offers["us-west4-a"][1] == Offer(
        "v5litepod-16", frozenset({("V5LITE_POD", "4x4")})
    )
    assert len(api.requests) == 3
    assert "pageToken=2" in api.requests[-1]


def test_unknown_types_are_kept_but_match_no_shape() -> None:
    api = FakeTpuApi(
        {
            "z1": [
                [
                    accelerator_type("z1", "v99x-8", "TYPE_UNSPECIFIED", "2x2"),
                    {"name": "projects/p/locations/z1/acceleratorTypes/odd", "type": "odd"},
                ]
            ]
        }
    )
    with serve(api) as endpoint:
        catalogue = read_catalogue(config(endpoint, "z1"))
    assert {o.type_name for o in catalogue.offers["z1"]} == {"v99x-8", "odd"}
    check = check_shape(catalogue, "tpu-v5-lite-podslice", "4x4")
    assert check.level is FindingLevel.WARNING
    assert "none of the zones z1" in check.message


@pytest.mark.parametrize(
    ("status", "problem"),
    [
        (403, ZoneProblem.PERMISSION_DENIED),
        (404, ZoneProblem.NOT_FOUND),
        (503, ZoneProblem.UNREACHABLE),
    ],
)
def test_a_zone_that_refuses_is_that_zones_problem(status: int, problem: ZoneProblem) -> None:
    api = FakeTpuApi({"good": [[accelerator_type("good", "v6e-16", "V6E", "4x4")]], "bad": status})
    with serve(api) as endpoint:
        catalogue = read_catalogue(config(endpoint, "good", "bad"))
    assert set(catalogue.offers) == {"good"}
    assert catalogue.problems["bad"][0] is problem
    assert check_shape(catalogue, "tpu-v6e-slice", "4x4").level is FindingLevel.OK


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_api_is_said_once_and_the_operator_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = CatalogueSource(config(f"http://127.0.0.1:{closed_port()}", "us-west4-a"))
    with caplog.at_level(logging.WARNING, logger="tpujob.gcp"):
        first = source.refresh()
        second = source.refresh()
    assert first is not None and second is not None
    assert not first.usable
    assert first.problems["us-west4-a"][0] is ZoneProblem.UNREACHABLE
    warnings = [r for r in caplog.records if "us-west4-a unreadable" in r.getMessage()]
    assert len(warnings) == 1
    assert check_shape(second, "tpu-v6e-slice", "4x4").level is FindingLevel.INFO


def test_a_good_catalogue_is_kept_when_a_later_read_fails() -> None:
    api = FakeTpuApi({"z1": [[accelerator_type("z1", "v6e-16", "V6E", "4x4")]]})
    with serve(api) as endpoint:
        source = CatalogueSource(config(endpoint, "z1"))
        good = source.refresh()
    assert good is not None and good.usable
    source.config = config(f"http://127.0.0.1:{closed_port()}", "z1")
    assert source.refresh() is good


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("us-west4-a, us-east5-b,,us-west4-a", ("us-west4-a", "us-east5-b")),
        (["europe-west4-a", " "], ("europe-west4-a",)),
        ("", ()),
    ],
)
def test_zones_from_flags_or_values(text: str | list[str], expected: tuple[str, ...]) -> None:
    assert parse_zones(text) == expected
