"""Where the tests find kubectl, helm and the control plane's binaries.

They are built from pinned Go modules by tools/build-control-plane.sh, which prints the folder
holding them on its last line and returns at once when they are already built. The answer is
cached per process, so a test session runs the script once.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-control-plane.sh"


class BinariesUnavailableError(RuntimeError):
    """The build script failed or did not produce the binary asked for."""


@functools.cache
def bin_dir() -> Path:
    """The folder holding the built binaries, building them first if needed (minutes, once)."""
    result = subprocess.run(
        [str(BUILD_SCRIPT)], capture_output=True, text=True, check=False, cwd=REPO_ROOT
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BinariesUnavailableError(
            f"{BUILD_SCRIPT.name} exited {result.returncode}:\n{result.stderr[-4000:]}"
        )
    folder = Path(lines[-1])
    if not folder.is_dir():
        raise BinariesUnavailableError(f"{BUILD_SCRIPT.name} printed {folder}, not a folder")
    return folder


def binary(name: str) -> Path:
    """The path of one built binary, e.g. `binary("helm")`."""
    path = bin_dir() / name
    if not path.is_file():
        raise BinariesUnavailableError(f"{name} is not among the built binaries in {path.parent}")
    return path
