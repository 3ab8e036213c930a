"""A failure recovered in place against the same failure recovered by replacing every pod.

One local cluster (`tpujob local up`, three two-host tpu-v4-podslice 2x2x2 pools) and one
operator run both arms, alternately, `--repeats` times each, in their own namespaces:

* `in-place`: a one-slice job of the real CPU JAX trainer whose worker 1 fails at step 30 of
  attempt 1 (`--fault hang`: it hangs, and the operator sees the stalled heartbeat; `--fault
  crash`: its training process kills itself with SIGKILL, and its supervisor reports the end on
  the heartbeat Lease and holds the pod); every trainer restarts as attempt 2 in the pod it ran
  in (the rejoin order);
* `replace`: the same job with the trainer told not to run under its supervisor
  (`--no-rejoin`), so the same failure deletes both pods and creates two new ones, as before.

For each run: the recovery, from the moment the operator saw the failure to attempt 2's first
step (`status.attemptHistory`: attempt 1's `ended` to attempt 2's `firstHeartbeat`), which holds
pod deletion, scheduling and start (replace only), process start, JAX start-up, compile and
restore. Detection (the stall timeout of a hang, 30 s; the report or the pod's end after a
crash) is not counted.

The limit beside them, measured on the same machine in the same run: a trainer process started
by hand on the checkpoint folder of a finished run, from its start to its first step (process
start, JAX start-up, restore, compile from the job's compilation cache): what a restart in
place cannot go below without keeping the process itself.

Writes bench/results/in_place.json (a hang) or in_place_crash.json. Needs root (pod network
namespaces) and the binaries of `make binaries`.

    python bench/bench_in_place.py --repeats 3 [--fault crash]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "bench")]

from bench_recovery import Bench, until  # noqa: E402

from tpujob.api import GROUP, PLURAL, VERSION, contract  # noqa: E402

FAULTS = {"hang": "hang@30:worker=1:attempt=1", "crash": "crash@30:worker=1:attempt=1"}
STEPS = 80
ARMS = {"in-place": [], "replace": ["--no-rejoin"]}
FIRST_STEP = re.compile(r"step (\d+)/")


def one_run(bench: Bench, fault: str, arm: str, i: int) -> dict[str, Any]:
    ns = bench.namespace(f"inplace-{arm}-{i}")
    bench.job(ns, "run", steps=STEPS, args=["--log-every", "1", "--fault", fault, *ARMS[arm]])
    status = until(
        lambda: (s := bench.status(ns, "run")).get("phase") in ("Succeeded", "Failed") and s,
        600,
        interval=1.0,
    )
    history = {r["attempt"]: r for r in status.get("attemptHistory", [])}
    failure = status.get("lastFailure") or {}
    result = {
        "phase": status.get("phase"),
        "code": failure.get("code"),
        "action": failure.get("action"),
        "restarts": (status.get("restarts") or {}).get("total"),
    }
    if 1 in history and 2 in history and history[2].get("firstHeartbeat") is not None:
        result["recovery_seconds"] = round(history[2]["firstHeartbeat"] - history[1]["ended"], 2)
    bench.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "run")
    return result


def limit_run(
    checkpoints: Path,
    steps: int = STEPS + 5,
    args: tuple[str, ...] = ("--batch-size", "16"),
    processes: int = 1,
) -> float:
    """Seconds from the start of `processes` trainer processes (one JAX world on this machine,
    its coordinator on loopback) to the first step, resumed from a copy of `checkpoints` (the
    trainer run with `args` for `steps` steps, past the checkpoint's)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "ckpt"
        subprocess.run(["cp", "-a", str(checkpoints), str(copy)], check=True)
        env = {
            **os.environ,
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(ROOT / "trainer_image"),
            contract.ENV_JAX_COMPILATION_CACHE_DIR: str(copy / contract.COMPILATION_CACHE_FOLDER),
        }
        if processes > 1:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            env.update(
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(processes)
            )
        argv = [
            sys.executable,
            "-m",
            "tpujob_trainer",
            *args,
            "--steps",
            str(steps),
            "--log-every",
            "1",
            "--checkpoint-dir",
            str(copy),
            "--no-rejoin",
        ]
        start = time.monotonic()
        # Process 0 is read; the others write nowhere (a full pipe would stall them).
        procs = [
            subprocess.Popen(
                argv,
                env={**env, "JAX_PROCESS_ID": str(i)} if processes > 1 else env,
                stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(processes)
        ]
        try:
            assert procs[0].stdout is not None
            for line in procs[0].stdout:
                if FIRST_STEP.search(line):
                    elapsed = time.monotonic() - start
                    break
            else:
                raise RuntimeError("the trainer ended before its first step")
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    return round(elapsed, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fault", choices=sorted(FAULTS), default="hang")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    fault = FAULTS[args.fault]
    name = "in_place.json" if args.fault == "hang" else f"in_place_{args.fault}.json"
    out_path: Path = args.out or ROOT / "bench" / "results" / name
    state = Path(tempfile.mkdtemp(prefix="tpujob-bench-inplace-"))
    bench = Bench(state)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    limits: list[float] = []
    try:
        for i in range(args.repeats):
            for arm in ARMS:
                runs[arm].append(one_run(bench, fault, arm, i))
                print(arm, i, runs[arm][-1], file=sys.stderr, flush=True)
            limits.append(limit_run(bench.checkpoints / f"inplace-in-place-{i}" / "run"))
    finally:
        bench.close()
    medians = {
        arm: statistics.median(r["recovery_seconds"] for r in rs if "recovery_seconds" in r)
        for arm, rs in runs.items()
        if any("recovery_seconds" in r for r in rs)
    }
    out = {
        "fault": fault,
        "stall_timeout_seconds": 30,
        "runs": runs,
        "limit_runs_seconds": limits,
        "median_recovery_seconds": medians,
        "median_limit_seconds": statistics.median(limits) if limits else None,
        "ratio_in_place_to_replace": round(medians["in-place"] / medians["replace"], 3)
        if len(medians) == 2
        else None,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
