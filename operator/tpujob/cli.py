"""The `tpujob` command: one entry point, each subcommand owned by the module it drives.

A subcommand module exposes `register(subparsers)`, which adds its parser and sets
`handler` (a callable taking the parsed namespace and returning an exit status). Modules are
imported only when their subcommand is registered, so `tpujob diagnose` never imports kopf.
A `CommandError` from any of them is printed here as one line on stderr, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Callable, Sequence

from tpujob.cli_output import CommandError

# Subcommand name -> module that registers it.
SUBCOMMANDS: tuple[tuple[str, str], ...] = (
    ("local", "tpujob.local.cli"),
    ("diagnose", "tpujob.diagnosis.cli"),
    ("regrade", "tpujob.regrade"),
    ("operator", "tpujob.controller.main"),
    ("crd", "tpujob.crdgen"),
    ("get", "tpujob.console"),
    ("describe", "tpujob.console"),
    ("doctor", "tpujob.doctor.cli"),
    ("release-jobs", "tpujob.release"),
)


def version() -> str:
    """The installed distribution's version; run from a source tree, the package's own."""
    try:
        return importlib.metadata.version("tpujob")
    except importlib.metadata.PackageNotFoundError:
        import tpujob

        return tpujob.__version__


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just the module owning that subcommand is imported."""
    parser = argparse.ArgumentParser(
        prog="tpujob", description="Run TPU training jobs on Kubernetes and keep them training."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    seen: set[str] = set()
    for name, module_name in SUBCOMMANDS:
        if (only is not None and name != only) or module_name in seen:
            continue
        seen.add(module_name)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            # The operator image leaves out `tpujob local` (a cluster with fault injection).
            if not err.name or not f"{module_name}.".startswith(f"{err.name}."):
                raise
            absent = subparsers.add_parser(name, help="(not in this build of tpujob)")
            absent.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
            absent.set_defaults(handler=_not_in_this_build(name))
            continue
        module.register(subparsers)
    return parser


def _not_in_this_build(name: str) -> Callable[[argparse.Namespace], int]:
    def handler(_: argparse.Namespace) -> int:
        raise CommandError(
            f"`tpujob {name}` is not in this build (the operator image leaves it out); "
            "install tpujob from a checkout of the repository to use it"
        )

    return handler


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    known = {name for name, _ in SUBCOMMANDS}
    only = args_list[0] if args_list and args_list[0] in known else None
    parser = build_parser(only)
    args = parser.parse_args(args_list)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except CommandError as err:
        print(f"tpujob: {err}", file=sys.stderr)
        return err.status


if __name__ == "__main__":
    sys.exit(main())
