"""`operator/` is a source root, not a package: the standard library's `operator` stays itself."""

from __future__ import annotations

import operator
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_operator_folder_is_not_a_package() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_stdlib_operator_is_not_shadowed_even_without_site() -> None:
    assert Path(operator.__file__).is_relative_to(sysconfig.get_paths()["stdlib"])
    code = "import operator, sys; print(operator.__file__)"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert Path(out.strip()).is_relative_to(sysconfig.get_paths()["stdlib"])


def test_generated_files_match_their_sources() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tpujob.crdgen", "check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(ROOT / "operator"), "PATH": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
