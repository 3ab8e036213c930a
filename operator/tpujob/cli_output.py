"""How the CLI's commands print: kubectl's `-o`, and the one-line error that stops a command.

A subcommand raises `CommandError` where kubectl would print `error: ...` and exit non-zero;
`tpujob.cli.main` prints it as `tpujob: <message>` on stderr and returns its status. This
module imports no Kubernetes client, so the entry point can catch the error for every command.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

JSON, YAML, WIDE = "json", "yaml", "wide"


class CommandError(RuntimeError):
    """The command cannot do what was asked; the message is one line for people."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


class _DeprecatedJson(argparse.Action):
    """`--json`, kept working for scripts written before `-o json`; says so on stderr."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print("tpujob: --json is deprecated; use -o json", file=sys.stderr)
        setattr(namespace, self.dest, JSON)


def add_output_option(parser: argparse.ArgumentParser, formats: Sequence[str]) -> None:
    """`-o/--output FORMAT` (default: the table for people), and the deprecated `--json`."""
    parser.add_argument(
        "-o", "--output", choices=formats, default=None, help="print as " + "|".join(formats)
    )
    parser.add_argument(
        "--json", dest="output", nargs=0, action=_DeprecatedJson, help="deprecated: -o json"
    )


def print_data(data: Any, output: str) -> None:
    """`data` (JSON-shaped) as `-o json` or `-o yaml` prints it."""
    if output == YAML:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    else:
        print(json.dumps(data, indent=2))


def print_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A kubectl table: one line per row, never cut to the terminal's width (a cut name or
    failure code is worse than a wrapped line)."""
    table = Table(box=None, pad_edge=False, padding=(0, 3, 0, 0))
    for column in columns:
        table.add_column(column, no_wrap=True)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    console = Console(highlight=False)
    natural = Measurement.get(console, console.options.update_width(1_000_000), table).maximum
    console = Console(highlight=False, width=max(console.width, natural))
    with console.capture() as captured:
        console.print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
