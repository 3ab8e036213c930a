"""Scale benchmark: tpujob against the JobSet controller and plain Indexed Jobs on fake TPU pools.

Each run of each arm gets a fresh local control plane (`--pools 0`: no TPU pools of its own)
with kwok faking GKE v5e 4x4 node pools, and one controller: tpujob's operator (a process from
this repository), JobSet (out of cluster, webhooks on loopback), or none (KCM's Job controller).
Arms run one after the other, their order rotated per run. Scenarios (`--scenario`):

  ladder    25, 100, 250 pools with as many workloads created at once
  drain     1,000 workloads running 60 s each through 250 pools
  recovery  250 workloads on 275 pools; 5 % of pods failed at once, then 2 % of nodes lost

Measured per run, the same way for every arm: create -> all pods Running per workload (p50,
p99, max), makespan, pods/s, fault -> running again, the controller's CPU seconds and peak RSS
(/proc), and apiserver requests by verb for all clients and per controller (FlowSchemas). A run
that does not finish within its timeout is recorded as such, with what ran by then. Results:
bench/results/scale-<scenario>.json and .png (`--quick`: scale-quick-*). Needs root and the
binaries of `make binaries` and `tools/build-bench-peers.sh`.

    python bench/bench_scale.py --quick                       # a few minutes: 25 pools, 1 run
    python bench/bench_scale.py --scenario ladder --sizes 250 --runs 3
    python bench/bench_scale.py --scenario drain recovery
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "bench")]

from scale import cluster, heartbeats, peers, report, scenarios, workloads  # noqa: E402

from tpujob.local.binaries import binary_dir  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--scenario", nargs="+", default=["ladder"], choices=["ladder", "drain", "recovery"]
    )
    p.add_argument("--arms", nargs="+", default=list(workloads.ARMS), choices=workloads.ARMS)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[25, 100, 250],
        help="ladder: pools, and as many workloads at once",
    )
    p.add_argument("--drain-jobs", type=int, default=1000)
    p.add_argument("--drain-pools", type=int, default=250)
    p.add_argument("--run-for", default="60s", help="drain: each workload's run time")
    p.add_argument("--recovery-jobs", type=int, default=250)
    p.add_argument("--recovery-pools", type=int, default=275)
    p.add_argument(
        "--timeout",
        type=float,
        default=600,
        help="ladder and drain: a run not done by then is recorded as a timeout",
    )
    p.add_argument(
        "--recovery-timeout",
        type=float,
        default=240,
        help="per fault phase (node repair recreates the Nodes at +90 s)",
    )
    p.add_argument(
        "--node-monitor-grace",
        type=int,
        default=50,
        help="KCM --node-monitor-grace-period (kwok renews Leases every lease/4)",
    )
    p.add_argument("--kwok-lease", type=int, default=40)
    p.add_argument("--seed", type=int, default=12)
    p.add_argument(
        "--quick",
        action="store_true",
        help="25 pools, 1 run, small drain and recovery: a few minutes per scenario",
    )
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    p.add_argument("--state-root", type=Path, default=None)
    p.add_argument(
        "--keep-logs",
        type=Path,
        default=None,
        help="copy each run's component logs (operator, controllers) here",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="add the runs to those already in the results file (e.g. another size)",
    )
    p.add_argument(
        "--replot",
        type=Path,
        nargs="+",
        default=[],
        help="only summarize and plot these results files again",
    )
    a = p.parse_args(argv)
    if a.quick:
        a.runs, a.sizes, a.timeout = 1, [25], 90.0
        a.recovery_timeout = min(a.recovery_timeout, 180.0)
        a.drain_jobs, a.drain_pools, a.run_for = 50, 25, "20s"
        a.recovery_jobs, a.recovery_pools = 20, 22
    return a


def plan(a: argparse.Namespace, scenario: str) -> list[tuple[int, int, workloads.Shape]]:
    """(size label, pools, shape) of each step of a scenario."""
    if scenario == "ladder":
        return [(n, n, workloads.Shape(pools=n)) for n in a.sizes]
    if scenario == "drain":
        return [
            (a.drain_jobs, a.drain_pools, workloads.Shape(pools=a.drain_pools, run_for=a.run_for))
        ]
    return [(a.recovery_jobs, a.recovery_pools, workloads.Shape(pools=a.recovery_pools))]


def one_run(
    a: argparse.Namespace,
    *,
    scenario: str,
    arm: str,
    size: int,
    pools: int,
    shape: workloads.Shape,
    bin_dir: Path,
    settings: cluster.Settings,
    run: int,
) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix=f"tpujob-scale-{arm}-", dir=a.state_root))
    arm_cluster = cluster.ArmCluster(arm, state, pools, settings)
    record: dict[str, Any] = {
        "scenario": scenario,
        "size": size,
        "arm": arm,
        "run": run,
        "pools": pools,
    }
    started = time.monotonic()
    try:
        arm_cluster.up(bin_dir)
        record["setup_s"] = round(time.monotonic() - started, 1)
        if scenario == "ladder":
            record["result"] = scenarios.ladder(arm_cluster, shape, size, a.timeout)
        elif scenario == "drain":
            record["result"] = scenarios.drain(arm_cluster, shape, size, a.timeout)
        else:
            record["result"] = scenarios.recovery(
                arm_cluster, shape, size, timeout=a.recovery_timeout, seed=a.seed + run
            )
    except Exception as err:  # a failed run is a result, not the end of the benchmark
        record["error"] = f"{err!r}"
        traceback.print_exc()
    finally:
        for name, proc in arm_cluster.procs.items():
            if not proc.alive():
                record.setdefault("exited", []).append(name)
        if (kwok := arm_cluster.procs.get("kwok")) is not None:
            record["fake_node_heartbeats"] = heartbeats.summary(
                kwok.log_path, settings.node_monitor_grace_seconds
            )
        if a.keep_logs is not None:  # the components' logs, for a run worth a closer look
            kept = a.keep_logs / f"{scenario}-{size}-{arm}-{run}"
            kept.mkdir(parents=True, exist_ok=True)
            for proc in arm_cluster.procs.values():
                if proc.log_path.exists():
                    shutil.copy(proc.log_path, kept)
        try:
            arm_cluster.close()
        except Exception as err:
            record.setdefault("error", f"teardown: {err!r}")
        shutil.rmtree(state, ignore_errors=True)
    record["wall_s"] = round(time.monotonic() - started, 1)
    return record


def runs_per_arm(runs: list[dict[str, Any]]) -> int:
    """From the records, so a file that --append grew says how many it holds."""
    return max(Counter((r["size"], r["arm"]) for r in runs).values(), default=0)


def write(
    a: argparse.Namespace, scenario: str, runs: list[dict[str, Any]], meta: dict[str, Any]
) -> Path:
    stem = f"scale-quick-{scenario}" if a.quick else f"scale-{scenario}"
    a.results.mkdir(parents=True, exist_ok=True)
    summary = report.summarize(scenario, runs) if runs else {}
    path: Path = a.results / f"{stem}.json"
    meta = {**meta, "runs_per_arm": runs_per_arm(runs)}
    path.write_text(
        json.dumps({**meta, "scenario": scenario, "summary": summary, "runs": runs}, indent=1)
        + "\n"
    )
    if runs:  # the table: report.markdown(scenario, summary)
        report.plot(scenario, runs, summary, a.results / f"{stem}.png")
    return path


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    for path in a.replot:
        data = json.loads(path.read_text())
        data["summary"] = report.summarize(data["scenario"], data["runs"])
        data["runs_per_arm"] = runs_per_arm(data["runs"])
        path.write_text(json.dumps(data, indent=1) + "\n")
        report.plot(data["scenario"], data["runs"], data["summary"], path.with_suffix(".png"))
        print(report.markdown(data["scenario"], data["summary"]))
    if a.replot:
        return 0
    if os.geteuid() != 0:
        print("the local cluster needs root (pod network namespaces)", file=sys.stderr)
        return 2
    bin_dir = peers.peers_dir()
    settings = cluster.Settings(
        node_monitor_grace_seconds=a.node_monitor_grace, kwok_lease_seconds=a.kwok_lease
    )
    versions = subprocess.run(
        [str(binary_dir() / "kubectl"), "version", "--client", "-o", "json"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout
    meta = {
        "command": "python bench/bench_scale.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count()},
        "settings": {
            **settings.__dict__,
            "peers": bin_dir.name,
            "kubernetes": json.loads(versions or "{}").get("clientVersion", {}).get("gitVersion"),
            "kcm_client_qps": "default (20, burst 30)",
            "scheduler_client_qps": "default (50, burst 100)",
            "jobset_client_qps": peers.JOBSET_QPS,
            "operator_args": list(peers.OPERATOR_ARGS),
            "job_arm_placement": "static: workload i on pool i mod pools",
        },
        "arms": a.arms,
    }
    for scenario in a.scenario:
        runs: list[dict[str, Any]] = []
        old = a.results / f"scale-{'quick-' if a.quick else ''}{scenario}.json"
        if a.append and old.exists():
            runs = json.loads(old.read_text())["runs"]
        for size, pools, shape in plan(a, scenario):
            # Appended runs are numbered after those recorded, so the arms' order keeps rotating
            # and every run keeps its own number (each record names the command that made it).
            first = 1 + max((r["run"] for r in runs if r.get("size") == size), default=-1)
            for run in range(first, first + a.runs):
                order = a.arms[run % len(a.arms) :] + a.arms[: run % len(a.arms)]
                for arm in order:
                    print(
                        f"== {scenario} size {size} pools {pools} arm {arm} run {run}",
                        file=sys.stderr,
                        flush=True,
                    )
                    record = one_run(
                        a,
                        scenario=scenario,
                        arm=arm,
                        size=size,
                        pools=pools,
                        shape=shape,
                        bin_dir=bin_dir,
                        settings=settings,
                        run=run,
                    )
                    record["command"] = meta["command"]
                    runs.append(record)
                    print(json.dumps(_brief(record)), file=sys.stderr, flush=True)
                    path = write(a, scenario, runs, meta)
        print(report.markdown(scenario, report.summarize(scenario, runs)))
        print(f"{scenario}: {path}")
    return 0


def _brief(record: dict[str, Any]) -> dict[str, Any]:
    res = record.get("result", {})
    return (
        {k: v for k, v in {**record, "result": None}.items() if k != "result"}
        | {
            k: res.get(k)
            for k in (
                "all_running",
                "all_done",
                "workloads_running",
                "workloads_done",
                "create_to_running_s",
                "makespan_s",
                "pods_failed",
                "nodes_lost",
            )
            if k in res
        }
        | (
            {
                "controller_cpu_s": res["cost"]["controller_cpu_seconds"],
                "arm_requests": res["cost"]["arm_requests"],
            }
            if "cost" in res
            else {}
        )
    )


if __name__ == "__main__":
    sys.exit(main())
