"""Find the local cluster's binaries: etcd, kube-apiserver, kube-scheduler,
kube-controller-manager (and kubectl, helm for tools and tests).

In order: `TPUJOB_BIN_DIR`; the build script of a source checkout (which builds them from the
pinned Go modules once per machine and prints their folder); the PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tpujob.local.processes import ComponentError

REQUIRED = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
OPTIONAL = ("kubectl", "helm")


def _checkout_script() -> Path | None:
    script = Path(__file__).resolve().parents[3] / "tools" / "build-control-plane.sh"
    return script if script.exists() else None


def binary_dir() -> Path:
    """The folder holding the binaries, building them from a source checkout if needed."""
    if env := os.environ.get("TPUJOB_BIN_DIR"):
        return Path(env)
    script = _checkout_script()
    if script is not None:
        proc = subprocess.run([str(script)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise ComponentError(f"building the control-plane binaries failed: {tail}")
        return Path(proc.stdout.strip().splitlines()[-1])
    found = shutil.which("kube-apiserver")
    if found is None:
        raise ComponentError("kube-apiserver not found: set TPUJOB_BIN_DIR or put it on PATH")
    return Path(found).parent


def locate_binaries() -> dict[str, Path]:
    """Paths of every required binary; a missing one is a one-line error naming it."""
    folder = binary_dir()
    found: dict[str, Path] = {}
    for name in REQUIRED + OPTIONAL:
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            found[name] = path
        elif name in REQUIRED:
            raise ComponentError(f"missing binary {name} in {folder}")
    return found
