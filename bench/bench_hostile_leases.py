"""The operator's memory under a tenant's labelled Leases with huge annotations, side by side.

A Lease anyone may create in their namespace can carry the label the operator's Lease watch
selects by and up to 256 KiB of annotations. Each arm runs the operator on the same local
control plane, one after the other and alternating across runs: its resident memory is read
once it has settled, then `--leases` such Leases are created in a tenant namespace, and its
memory is read again once it has seen them. The arms:

* `current`: this tree's operator, which caches only a Lease a job owns under its heartbeat's
  name, and of it only the bounded health annotations;
* `before-fix`: the operator as it was before that (commit `BASELINE`), which cached every
  labelled Lease with all its annotations.

The limits: caching nothing costs 0 bytes; caching everything costs at least the annotations'
bytes (`payload_mib`), which is what `before-fix` is measured against. Writes
bench/results/hostile-leases.json. Needs the binaries `make binaries` builds.
Example: `python bench/bench_hostile_leases.py --runs 2 --leases 400`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_recovery import cluster_with_crds  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from scale import measure  # noqa: E402

from tpujob.api import labels  # noqa: E402
from tpujob.local import controlplane  # noqa: E402

# The last commit whose operator cached every labelled Lease whole.
BASELINE = "8a9502441a0a0f479bf395127a0556b635bac186~1"
POOLS = controlplane.PoolOptions(pools=1, accelerator="tpu-v4-podslice", topology="2x2x2")
TENANT = "tenant-squatter"
OPERATOR_ARGS = ["--all-namespaces", "--metrics-port", "0", "--liveness-port", "0"]


def source_tree(commit: str, into: Path) -> Path:
    """The operator package as it was at `commit`, unpacked under `into`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "operator"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "operator"


def rss_mib(pid: int, samples: int = 5) -> float:
    """The largest of a few readings a second apart (a collection may be under way)."""
    readings: list[float] = []
    for _ in range(samples):
        found = measure.proc(pid)
        if found is None:
            raise RuntimeError("the operator exited; see its log")
        readings.append(float(found.rss_mib))
        time.sleep(1)
    return max(readings)


def hostile_lease(i: int, size: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"squat-{i}",
            "labels": {labels.JOB: f"squat-{i}"},
            "annotations": {f"tpujob.dev/junk-{i}": "x" * size},
        },
        "spec": {"holderIdentity": "squatter"},
    }


class Bench:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.kubeconfig = cluster_with_crds(state_dir, POOLS)
        api = config.new_client_from_config(str(self.kubeconfig))
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.core.create_namespace({"metadata": {"name": TENANT}})

    def close(self) -> None:
        controlplane.down(self.state_dir, purge=True)

    def arm(self, source: Path, log: Path, leases: int, size: int, settle: float) -> dict[str, Any]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "tpujob.cli", "operator"),
                    *("--kubeconfig", str(self.kubeconfig), *OPERATOR_ARGS),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(source)},
            )
        try:
            time.sleep(settle)
            before = rss_mib(proc.pid)
            started = time.monotonic()
            for i in range(leases):
                self.coord.create_namespaced_lease(TENANT, hostile_lease(i, size))
            created_s = time.monotonic() - started
            time.sleep(settle)
            after = rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            self._clear()
        return {
            "rss_before_mib": before,
            "rss_after_mib": after,
            "growth_mib": round(after - before, 1),
            "create_seconds": round(created_s, 1),
        }

    def _clear(self) -> None:
        self.coord.delete_collection_namespaced_lease(TENANT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if not self.coord.list_namespaced_lease(TENANT).items:
                    return
            except ApiException:
                pass
            time.sleep(0.5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--leases", type=int, default=400)
    p.add_argument("--annotation-bytes", type=int, default=200_000)
    p.add_argument("--settle", type=float, default=20.0, help="seconds before each reading")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    a = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tpujob-hostile-"))
    sources = {"current": ROOT / "operator", "before-fix": source_tree(BASELINE, work / "base")}
    bench = Bench(work / "cluster")
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in sources}
    try:
        for run in range(a.runs):
            # Alternate which arm goes first, so neither always meets a warmer apiserver.
            order = list(sources) if run % 2 == 0 else list(reversed(sources))
            for arm in order:
                result = bench.arm(
                    sources[arm], work / f"{arm}.log", a.leases, a.annotation_bytes, a.settle
                )
                print(arm, result, file=sys.stderr)
                runs[arm].append(result)
    finally:
        bench.close()

    growth = {arm: statistics.median(r["growth_mib"] for r in rs) for arm, rs in runs.items()}
    payload = round(a.leases * a.annotation_bytes / 2**20, 1)
    report = {
        "what": "operator resident memory growth after a tenant creates labelled Leases",
        "baseline_commit": BASELINE,
        "leases": a.leases,
        "annotation_bytes": a.annotation_bytes,
        "payload_mib": payload,
        "runs": runs,
        "median_growth_mib": growth,
        "growth_ratio_current_to_before_fix": (
            round(growth["current"] / growth["before-fix"], 3) if growth["before-fix"] else None
        ),
        "before_fix_growth_per_payload": round(growth["before-fix"] / payload, 2),
    }
    a.results.mkdir(parents=True, exist_ok=True)
    out = a.results / "hostile-leases.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["median_growth_mib"]), f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
