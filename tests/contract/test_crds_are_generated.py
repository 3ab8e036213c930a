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
    assert [d.reason for d in crdgen.check(tmp_path)] == ["missing", "missing", "missing"]


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
