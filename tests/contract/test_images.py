"""Contract tests for the container images' recipes: one trainer Dockerfile for every variant,
public bases pinned by digest, and an operator image without `tpujob local` (the local cluster
and its fault injection) whose command still works and says what it left out.

They read the Dockerfiles and the sources; hack/build-images.sh checks the built images.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from tests.binaries import REPO_ROOT

DOCKERFILES = [REPO_ROOT / "Dockerfile", REPO_ROOT / "trainer_image" / "Dockerfile"]
PACKAGE = REPO_ROOT / "operator" / "tpujob"


def test_the_trainer_has_one_dockerfile_whose_variants_are_its_lockfiles() -> None:
    assert sorted(p.name for p in (REPO_ROOT / "trainer_image").glob("Dockerfile*")) == [
        "Dockerfile"
    ]
    dockerfile = (REPO_ROOT / "trainer_image" / "Dockerfile").read_text()
    accepted = re.search(r'case "\$VARIANT" in ([\w|]+)\)', dockerfile)
    assert accepted is not None
    variants = set(accepted.group(1).split("|"))
    locks = {p.stem for p in (REPO_ROOT / "trainer_image" / "requirements").glob("*.lock")}
    assert variants == locks - {"build"}
    # Each variant has its own name and description.
    assert {f"runtime-{v}" for v in variants} <= set(re.findall(r" AS (\S+)$", dockerfile, re.M))
    script = (REPO_ROOT / "hack" / "build-images.sh").read_text()
    for variant in variants:
        spec = rf"/requirements/{variant}\.lock\|[^|]*\|VARIANT={variant}\""
        assert re.search(spec, script), f"build-images.sh builds no {variant} trainer"


def test_public_bases_are_pinned_by_digest() -> None:
    bases = set()
    for dockerfile in DOCKERFILES:
        (base,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", dockerfile.read_text(), re.MULTILINE)
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}", base), base
        bases.add(base)
    assert len(bases) == 1, "the operator and the trainers start from one base"


def _removed_from_operator_image() -> list[str]:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    removed = re.search(r"^RUN rm -r ((?:operator/\S+ ?)+)", dockerfile, re.MULTILINE)
    assert removed is not None, "the operator Dockerfile removes nothing before building"
    return removed.group(1).split()


def test_operator_image_leaves_out_the_local_cluster_and_nothing_it_needs() -> None:
    removed = [REPO_ROOT / path for path in _removed_from_operator_image()]
    assert PACKAGE / "local" in removed
    assert all(path.exists() for path in removed), removed
    modules = set()
    for path in removed:
        for source in [path] if path.is_file() else path.rglob("*.py"):
            parts = source.relative_to(PACKAGE.parent).with_suffix("").parts
            modules.add(".".join(parts).removesuffix(".__init__"))
    for path in PACKAGE.rglob("*.py"):
        if any(path == r or path.is_relative_to(r) for r in removed):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            assert not modules.intersection(names), f"{path} imports what the image leaves out"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; sys.modules['tpujob.local'] = None\n"
        "from tpujob.cli import main\n"
        f"sys.exit(main({list(args)!r}))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"PYTHONPATH": str(REPO_ROOT / "operator"), "PATH": ""},
    )


def test_the_command_works_without_the_local_cluster_and_says_it_is_not_in_this_build() -> None:
    version = _cli("--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.startswith("tpujob ")
    assert _cli("diagnose", "--help").returncode == 0
    local = _cli("local", "up", "--workers", "2")
    assert local.returncode == 1
    assert local.stdout == ""
    assert "`tpujob local` is not in this build" in local.stderr
    assert "Traceback" not in local.stderr
