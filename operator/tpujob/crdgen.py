"""Writes and checks the generated CRD: `tpujob crd write|check`, `python -m tpujob.crdgen`.

The CRD comes from the API models (`tpujob.api.schema`); this module only renders it as YAML
and puts it in the two places that ship it: `crds/` (applied by tests and by
`kubectl apply --server-side -f crds/`) and the Helm chart's `crds/` folder. `check` exits 1
when either file differs from what the models produce, so CI catches a model change without
a regenerated CRD.

It also writes `docs/topologies.md`, the table of every accelerator and topology the CRD
admits, from the same table (`tpujob.api.topology`), so the page cannot fall behind what the
apiserver accepts, and `docs/metrics.md`, every metric the operator exports, from the
metrics' own definitions.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tpujob.api import constants as c
from tpujob.api import topology
from tpujob.api.schema import custom_resource_definition
from tpujob.controller import metrics

FILE_NAME = f"{c.GROUP}_{c.PLURAL}.yaml"
OUTPUT_DIRS = ("crds", "charts/tpujob-operator/crds")
TOPOLOGY_DOC = Path("docs/topologies.md")
METRICS_DOC = Path("docs/metrics.md")
HEADER = (
    "# Generated from the tpujob.api models by `tpujob crd write`; do not edit by hand.\n"
    "# Edit operator/tpujob/api/ and run `make generate` instead.\n"
)


@dataclass(frozen=True)
class Drift:
    """A generated file that is missing or differs from what the models produce."""

    path: Path
    reason: str


def render() -> str:
    """The CRD as the YAML text written to disk."""
    body = yaml.safe_dump(
        custom_resource_definition(), sort_keys=False, width=100, allow_unicode=True
    )
    return HEADER + body


def render_topologies() -> str:
    """Every admitted accelerator and topology: the pods a slice needs and what each asks."""
    lines = [
        "<!-- Generated from tpujob.api.topology by `make generate`; do not edit by hand. -->",
        "# Accelerators and topologies",
        "",
        "What `spec.tpu.accelerator` and `spec.tpu.topology` admit. A slice runs one worker pod",
        "per host (GKE node), each requesting `google.com/tpu` equal to its chips per host; a",
        "job of `spec.tpu.slices` slices needs that many node pools of the shape. Only",
        "multi-host slices can form a multislice job.",
    ]
    for row in topology.ACCELERATORS:
        lines += [
            "",
            f"## `{row.label}` ({row.generation})",
            "",
            "| topology | chips | hosts (pods) | chips per host | Cloud TPU type | multislice |",
            "|---|---|---|---|---|---|",
        ]
        for shape in (topology.resolve(row.label, t) for t in row.chips_per_host):
            lines.append(
                f"| `{shape.topology}` | {shape.chips} | {shape.hosts} | {shape.chips_per_host} "
                f"| `{shape.tpu_type}` | {'yes' if shape.multi_host else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def render_metrics() -> str:
    """Every metric `/metrics` serves, with its type, labels and meaning."""
    lines = [
        "<!-- Generated from tpujob.controller.metrics by `make generate`; do not edit. -->",
        "# Metrics",
        "",
        "What the operator serves on `/metrics` (the port is the chart value `metrics.port`),",
        "besides the client's `process_*` series (CPU seconds, resident memory, open files)",
        "and the `_created` series (start time) of each counter and histogram.",
        "The `namespace` and `job` labels are the job's; the chart's ServiceMonitor keeps them",
        "over Prometheus' own target labels of those names (`honorLabels: true`).",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    for name, kind, labels, doc in metrics.reference():
        shown = ", ".join(f"`{label}`" for label in labels) or "none"
        series = " (`_bucket`, `_sum`, `_count`)" if kind == "histogram" else ""
        lines.append(f"| `{name}` | {kind}{series} | {shown} | {doc} |")
    return "\n".join(lines) + "\n"


def _docs() -> tuple[tuple[Path, str], ...]:
    return ((TOPOLOGY_DOC, render_topologies()), (METRICS_DOC, render_metrics()))


def output_paths(root: Path) -> tuple[Path, ...]:
    """Where the CRD is written, under the repository root."""
    return tuple(root / d / FILE_NAME for d in OUTPUT_DIRS)


def write(root: Path) -> tuple[Path, ...]:
    """Write the CRD to every output path; returns the paths written."""
    text = render()
    paths = output_paths(root)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    docs = []
    for relative, page in _docs():
        doc = root / relative
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(page, encoding="utf-8")
        docs.append(doc)
    return (*paths, *docs)


def check(root: Path) -> tuple[Drift, ...]:
    """Files under `root` that drifted from the models (empty when all are current)."""
    text = render()
    expected = [(path, text) for path in output_paths(root)]
    expected += [(root / relative, page) for relative, page in _docs()]
    drifts = []
    for path, want in expected:
        if not path.exists():
            drifts.append(Drift(path, "missing"))
        elif path.read_text(encoding="utf-8") != want:
            drifts.append(Drift(path, "differs from the models"))
    return tuple(drifts)


def _run(args: argparse.Namespace) -> int:
    root = Path(args.root)
    if args.action == "write":
        for path in write(root):
            print(f"wrote {path}")
        return 0
    drifts = check(root)
    for drift in drifts:
        print(f"{drift.path}: {drift.reason}; run `make generate`", file=sys.stderr)
    return 1 if drifts else 0


def register(subparsers: Any) -> None:
    """Add the `crd` subcommand to the `tpujob` command."""
    parser = subparsers.add_parser(
        "crd", help="write or check the generated CustomResourceDefinition"
    )
    _configure(parser)


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=("write", "check"),
        help="write: regenerate the CRD files; check: exit 1 if they are out of date",
    )
    parser.add_argument(
        "--root", default=".", help="repository root holding crds/ and charts/ (default: .)"
    )
    parser.set_defaults(handler=_run)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpujob.crdgen", description=__doc__)
    _configure(parser)
    args = parser.parse_args(argv)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
