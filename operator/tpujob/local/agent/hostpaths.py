"""hostPath volumes on the local node, checked and created as the kubelet's hostPath plugin does.

The same rules hold for a pod's own `hostPath` volume and for a claim bound to a hostPath
PersistentVolume (the kubelet mounts both with one plugin): `DirectoryOrCreate` makes a missing
folder (mode 0755, parents too), `FileOrCreate` an empty file (0644, the parent must exist),
and the other types check what is there, failing with the kubelet's message
("hostPath type check failed: PATH is not a directory"). With no type, nothing is checked, and
a missing path becomes a folder, as the container runtime makes a missing bind-mount source
(measured in docs/kubelet-fidelity.md).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path


class HostPathError(RuntimeError):
    """The path is not what the volume's type asks for; the kubelet's message."""


def _is(mode_test: Callable[[int], bool]) -> Callable[[Path], bool]:
    def test(path: Path) -> bool:
        try:
            return mode_test(path.stat().st_mode)
        except OSError:
            return False

    return test


# type -> (test of what is there, what the kubelet says when it fails)
CHECKS: dict[str, tuple[Callable[[Path], bool], str]] = {
    "Directory": (_is(stat.S_ISDIR), "is not a directory"),
    "File": (_is(stat.S_ISREG), "is not a file"),
    "Socket": (_is(stat.S_ISSOCK), "is not a socket file"),
    "CharDevice": (_is(stat.S_ISCHR), "is not a character device"),
    "BlockDevice": (_is(stat.S_ISBLK), "is not a block device"),
}


def prepare(path: Path, kind: str | None) -> Path:
    """Make `path` ready to mount as a hostPath volume of type `kind`; HostPathError if not."""
    kind = kind or ""
    try:
        if kind == "":
            # Not the kubelet's doing: the runtime creates a missing bind-mount source.
            if not os.path.lexists(path):
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
            return path
        if kind == "DirectoryOrCreate":
            if not path.exists():
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
            kind = "Directory"
        elif kind == "FileOrCreate":
            if not path.exists():
                # Like the kubelet's os.OpenFile(O_CREATE): the parent folder must exist.
                os.close(os.open(path, os.O_CREAT | os.O_RDONLY, 0o644))
            kind = "File"
    except OSError as err:
        raise HostPathError(f"{path}: {err.strerror}") from err
    if kind not in CHECKS:
        raise HostPathError(f"{kind} is an invalid volume type")
    test, failure = CHECKS[kind]
    if not test(path):
        raise HostPathError(f"hostPath type check failed: {path} {failure}")
    return path
