"""crds/ and the chart's copy are exactly what the API models generate (`make generate`)."""

from __future__ import annotations

from pathlib import Path

from tpujob import cli, crdgen

ROOT = Path(__file__).parents[2]


def test_committed_crds_match_the_models() -> None:
    drifts = crdgen.check(ROOT)
    assert not drifts, "; ".join(f"{d.path}: {d.reason}" for d in drifts) + (
        " -- run `make generate`"
    )


def test_chart_ships_a_byte_identical_copy_of_the_crd() -> None:
    source, chart_copy = crdgen.output_paths(ROOT)
    assert chart_copy.read_bytes() == source.read_bytes()


def test_check_reports_a_hand_edited_crd(tmp_path: Path) -> None:
    crdgen.write(tmp_path)
    edited = crdgen.output_paths(tmp_path)[1]
    edited.write_text(edited.read_text().replace("maxItems: 32", "maxItems: 33"))
    assert [d.path for d in crdgen.check(tmp_path)] == [edited]


def test_check_reports_a_missing_crd(tmp_path: Path) -> None:
    assert [d.reason for d in crdgen.check(tmp_path)] == ["missing"] * 4


def test_check_reports_a_topology_page_behind_the_table(tmp_path: Path) -> None:
    crdgen.write(tmp_path)
    page = tmp_path / crdgen.TOPOLOGY_DOC
    page.write_text(page.read_text().replace("| `4x8` | 32 | 8 |", "| `4x8` | 32 | 4 |"))
    assert [d.path for d in crdgen.check(tmp_path)] == [page]


def test_the_topology_page_lists_every_admitted_shape_with_its_pods() -> None:
    from tpujob.api import topology

    page = (ROOT / crdgen.TOPOLOGY_DOC).read_text()
    for shape in topology.all_shapes():
        assert f"| `{shape.topology}` | {shape.chips} | {shape.hosts} |" in page


def test_cli_check_exits_nonzero_on_drift(tmp_path: Path) -> None:
    assert crdgen.main(["check", "--root", str(tmp_path)]) == 1
    assert crdgen.main(["write", "--root", str(tmp_path)]) == 0
    assert crdgen.main(["check", "--root", str(tmp_path)]) == 0


def test_tpujob_crd_subcommand_checks_the_files(tmp_path: Path) -> None:
    assert cli.main(["crd", "write", "--root", str(tmp_path)]) == 0
    assert cli.main(["crd", "check", "--root", str(tmp_path)]) == 0
    crdgen.output_paths(tmp_path)[0].unlink()
    assert cli.main(["crd", "check", "--root", str(tmp_path)]) == 1


def test_the_metrics_page_names_every_series_a_scrape_serves() -> None:
    from prometheus_client import generate_latest

    from tpujob.api import GoodputBreakdown
    from tpujob.controller.metrics import Metrics

    served = Metrics()
    served.record_failure("soft", "PROCESS_KILLED", restarted=True)
    served.record_recovery(3.0)
    served.record_request("get")
    served.record_job("ns", "job", None, 0.5, 1)
    served.record_breakdown("ns", "job", GoodputBreakdown(wall_seconds=1, productive=1.0))
    page = (ROOT / crdgen.METRICS_DOC).read_text()
    families = {
        line.split()[2]
        for line in generate_latest(served.registry).decode().splitlines()
        if line.startswith("# TYPE tpujob_") and not line.split()[2].endswith("_created")
    }
    assert families, "the registry serves no tpujob metric"
    for family in families:
        assert f"`{family}" in page, family
