#!/usr/bin/env python3
"""Measure the kubelet behaviours the operator relies on, on a real kubelet (kind) and on the
local cluster's node agent, the same probes on both (docs/kubelet-fidelity.md).

    hack/kubelet-fidelity.py kind  [--out FILE] [--keep]   # a kind cluster of its own
    hack/kubelet-fidelity.py local [--out FILE] [--keep]   # a local cluster of its own
    hack/kubelet-fidelity.py report KIND.json LOCAL.json   # the two side by side (Markdown)

`kind` builds what it lacks as `make e2e-kind` does (the node image, kind, the CPU trainer
image, whose python3 runs the probes), creates a control plane and one worker, and loads the
image into the worker. `local` starts `tpujob local up` in .state/fidelity. Each writes its
findings as JSON (default .state/fidelity-TARGET.json) and removes its cluster unless --keep.
Run it with the project's virtual environment (`.venv/bin/python hack/kubelet-fidelity.py`),
as root, with Docker for `kind`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fidelity_checks import CHECKS, cleanup_volumes
from fidelity_probes import PROBE_DIR, Target
from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
KIND_CLUSTER = "tpujob-fidelity"
KIND_CONFIG = """kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
"""


def sh(*argv: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(argv, check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return out.stdout.strip()


def version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise SystemExit("no version in pyproject.toml")


@contextmanager
def kind_target(run: str, keep: bool) -> Iterator[Target]:
    sh("hack/ensure-docker.sh")
    node_image = sh("hack/kind-node-image.sh").splitlines()[-1]
    cache = Path(
        os.environ.get("TPUJOB_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tpujob"
    )
    kind_version = next(
        line.split()[2]
        for line in (ROOT / "tools/kind/go.mod").read_text().splitlines()
        if line.startswith("require sigs.k8s.io/kind ")
    )
    control_plane = sh("tools/build-control-plane.sh").splitlines()[-1]
    # tools/kind/privileged first: kind's docker, for hosts whose capability set is incomplete.
    path = f"{ROOT}/tools/kind/privileged:{cache}/kind/bin/kind-{kind_version}:{control_plane}"
    env = {**os.environ, "PATH": f"{path}:{os.environ['PATH']}"}
    image = f"ghcr.io/tpujob/tpujob-trainer-cpu:{version()}"
    sh("hack/build-images.sh", "trainer-cpu", env={**env, "IMAGE_TAG": version()})
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig, kind_config = f"{tmp}/kubeconfig", f"{tmp}/kind.yaml"
        Path(kind_config).write_text(KIND_CONFIG)
        node = f"{KIND_CLUSTER}-worker"
        try:
            print(f"kind cluster {KIND_CLUSTER} from {node_image}", flush=True)
            sh(
                "kind", "create", "cluster", "--name", KIND_CLUSTER, "--config", kind_config,
                "--kubeconfig", kubeconfig, "--image", node_image, "--wait", "300s", env=env,
            )  # fmt: skip
            sh("kind", "load", "docker-image", "--name", KIND_CLUSTER, "--nodes", node, image,
               env=env)  # fmt: skip

            def read_node_file(path: str) -> str:
                proc = subprocess.run(
                    ["docker", "exec", node, "cat", path],
                    check=False,
                    capture_output=True,
                    text=True,
                )
                return proc.stdout if proc.returncode == 0 else ""

            yield Target(
                name="kind",
                core=client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig)),
                node=node,
                image=image,
                run=run,
                read_node_file=read_node_file,
                node_down=lambda: sh("docker", "stop", node),
                node_up=lambda: sh("docker", "start", node),
            )
        finally:
            if not keep:
                subprocess.run(
                    ["kind", "delete", "cluster", "--name", KIND_CLUSTER], check=False, env=env
                )


@contextmanager
def local_target(run: str, keep: bool) -> Iterator[Target]:
    state = ROOT / ".state" / "fidelity"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    tpujob = [sys.executable, "-m", "tpujob.cli", "local"]
    sh(*tpujob, "up", "--state-dir", str(state), "--pools", "1", "--accelerator",
       "tpu-v4-podslice", "--topology", "2x2x2", env=env)  # fmt: skip
    try:
        core = client.CoreV1Api(config.new_client_from_config(str(state / "kubeconfig")))
        node = next(
            n.metadata.name
            for n in core.list_node().items
            if "cloud.google.com/gke-tpu-accelerator" not in (n.metadata.labels or {})
        )

        def read_node_file(path: str) -> str:
            try:
                return Path(path).read_text()
            except OSError:
                return ""

        def fault(kind: str) -> None:
            sh(*tpujob, "fault", kind, node, "--state-dir", str(state), env=env)

        yield Target(
            name="local",
            core=core,
            node=node,
            image="local",  # the node agent runs commands of this machine, not images
            run=run,
            read_node_file=read_node_file,
            node_down=lambda: fault("node-down"),
            node_up=lambda: fault("node-up"),
        )
    finally:
        if not keep:
            subprocess.run(
                [*tpujob, "down", "--state-dir", str(state), "--purge"], check=False, env=env
            )


def measure(t: Target, only: list[str]) -> dict[str, Any]:
    t.core.create_namespace({"metadata": {"name": t.namespace}})
    # Pods are refused until the service account controller has made `default`.
    while not t.core.list_namespaced_service_account(t.namespace).items:
        time.sleep(0.2)
    version_info = client.VersionApi(t.core.api_client).get_code()
    node = t.core.read_node(t.node)
    results: dict[str, Any] = {
        "target": t.name,
        "kubernetes": version_info.git_version,
        "kubelet": node.status.node_info.kubelet_version,
        "container_runtime": node.status.node_info.container_runtime_version,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        for name, check in CHECKS.items():
            if only and name not in only:
                continue
            start = time.time()
            print(f"== {name}", flush=True)
            results[name] = check(t)
            print(json.dumps(results[name], indent=1), flush=True)
            print(f"   ({time.time() - start:.0f}s)", flush=True)
    finally:
        cleanup_volumes(t)
        t.core.delete_namespace(t.namespace)
        if t.name == "local":
            subprocess.run(["rm", "-rf", f"{PROBE_DIR}/{t.run}"], check=False)
    return results


def _cell(value: Any) -> str:
    text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else value
    return text.replace("|", "\\|")


def report(kind: dict[str, Any], local: dict[str, Any]) -> str:
    """Every leaf of the two findings side by side, in the order of `CHECKS`."""
    lines = [
        f"| | kind (kubelet {kind.get('kubelet')}, {kind.get('container_runtime')}) "
        f"| local node agent |",
        "|---|---|---|",
    ]
    for check in CHECKS:
        k, lo = kind.get(check) or {}, local.get(check) or {}
        for key in dict.fromkeys([*k, *lo]):
            a, b = k.get(key, "-"), lo.get(key, "-")
            mark = "" if a == b else " **≠**"
            lines.append(f"| {check}: {key}{mark} | {_cell(a)} | {_cell(b)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", choices=("kind", "local", "report"))
    parser.add_argument("files", nargs="*", help="report: the kind and local JSON files")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", action="store_true", help="leave the cluster up")
    parser.add_argument("--only", action="append", default=[], choices=sorted(CHECKS))
    args = parser.parse_args()
    if args.target == "report":
        # Each run names its namespace and folders by a random id: compare without it.
        kind, local = (
            json.loads(re.sub(r"(fidelity-|fidelity/)[0-9a-f]{6}", r"\1RUN", Path(f).read_text()))
            for f in args.files
        )
        print(report(kind, local))
        return
    run = uuid.uuid4().hex[:6]
    out = args.out or ROOT / ".state" / f"fidelity-{args.target}.json"
    target = kind_target if args.target == "kind" else local_target
    with target(run, args.keep) as t:
        results = measure(t, args.only)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"findings in {out}")


if __name__ == "__main__":
    main()
