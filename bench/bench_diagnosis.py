"""Benchmark: per-diagnosis latency (p50/p99) of the engine, and throughput against a baseline.

Run as `python bench/bench_diagnosis.py [--n 2000] [--big 200] [--baseline REV] [--out FILE]`.
Logs are generated from a fixed seed: 80 lines of training chatter ending in one failure's
lines (from a fixed set of mechanisms); 10 MB logs of chatter ending in each of those
failures in turn; the worst case of a 64 KB tail: one line of numbers, hex ids, addresses,
paths and host names that no rule names, so the text model reads it after every rule has
searched it; and that worst case again as the end of a 10 MB log. The 10 MB cases run
`--big` diagnoses each (more than 100, so the p99 is not simply the slowest one). The
baseline arm is the engine as of `--baseline` (a git revision, default the last commit before
the catalogues), checked out with `git worktree` into a temporary directory and run in a
child process on the same logs in the same run; the JSON result holds both arms' figures
(wall and CPU time per diagnosis, p50 and p99), their throughput ratio for every case, and
each arm's text model size (bytes of its weights file, features). Not a test: the numbers
depend on the machine, and the wall p99 on what else it runs.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEED = 20260101
# The engine before the catalogues, site rules and the measured unknown policy.
DEFAULT_BASELINE = "ca5941f"
TAILS = (
    "jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer",
    "XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory",
    "XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: checkpoint-sync",
    "TypeError: dot_general requires contracting dimensions to have the same shape",
    "Warning NodeNotReady pod/w-0 Node is not ready",
    "NCCL WARN NET/IB : Got completion from peer 10.0.0.1<1> with error 12, vendor err 129",
    "HTTPError: 503 Server Error: Service Unavailable for url: https://storage.googleapis.com/b",
    "training stopped after the last step, no message",
)
CHATTER = "I0101 12:00:{:02d}.000 train.py:88] step {} loss {:.4f} throughput 1234.5 tokens/s"
CASES = ("tail80", "log10mb", "worst64kb", "worst10mb")
PATHOLOGICAL = "a1b2c3 10.0.0.1:8470 0xdeadbeef /a/b/c w-1.pool.internal 12345 "


def make_logs(n: int, lines: int) -> list[str]:
    rng = random.Random(SEED)
    logs = []
    for i in range(n):
        body = [CHATTER.format(k % 60, k, rng.random()) for k in range(lines - 1)]
        logs.append("\n".join([*body, TAILS[i % len(TAILS)]]))
    return logs


def make_big_log(size: int, tail: str = TAILS[3]) -> str:
    line = CHATTER.format(1, 1, 0.5) + "\n"
    return line * ((size - len(tail)) // len(line)) + tail + "\n"


def make_worst_tail(size: int) -> str:
    return (PATHOLOGICAL * (size // len(PATHOLOGICAL) + 1))[:size]


def percentiles(prefix: str, times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        f"{prefix}_p50_ms": 1e3 * times[len(times) // 2],
        f"{prefix}_p99_ms": 1e3 * times[min(len(times) - 1, int(len(times) * 0.99))],
    }


def timed(name: str, logs: list[str]) -> dict[str, float]:
    """Wall and CPU percentiles of diagnosing each log, and diagnoses per wall second.

    On a shared machine the wall p99 is mostly other processes' time slices; the CPU time
    of this thread is what the engine itself spent.
    """
    from tpujob.diagnosis import WorkerFacts, diagnose_worker

    wall, cpu = [], []
    start = time.perf_counter()
    for log in logs:
        t, c = time.perf_counter(), time.thread_time()
        diagnose_worker(WorkerFacts(exit_code=1, log_tail=log))
        cpu.append(time.thread_time() - c)
        wall.append(time.perf_counter() - t)
    total = time.perf_counter() - start
    return {
        **percentiles(name, wall),
        **percentiles(f"{name}_cpu", cpu),
        f"{name}_per_s": len(logs) / total,
    }


def model_size() -> dict[str, float]:
    """The text model of the engine importable from sys.path: weights file bytes, features."""
    from importlib import resources

    from tpujob.diagnosis.textmodel import packaged_model

    weights = resources.files("tpujob.diagnosis").joinpath("textmodel.json")
    return {
        "model_bytes": float(len(weights.read_bytes())),
        "model_features": float(len(packaged_model().index)),
    }


def run_arm(n: int, big: int) -> dict[str, float]:
    """Time the engine importable from sys.path (this process's arm)."""
    from tpujob.diagnosis import WorkerFacts, diagnose_worker

    logs = make_logs(n, 80)
    diagnose_worker(WorkerFacts(exit_code=1, log_tail=logs[0]))  # load tables and model once
    big_logs = [make_big_log(10_000_000, tail) for tail in TAILS]
    worst = make_worst_tail(64_000)
    return {
        **timed("tail80", logs),
        **timed("log10mb", [big_logs[i % len(big_logs)] for i in range(big)]),
        **timed("worst64kb", [worst] * big),
        **timed("worst10mb", [make_big_log(10_000_000, worst)] * big),
        **model_size(),
    }


def baseline_arm(rev: str, n: int, big: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev],
            check=True,
        )
        try:
            paths = [str(tree / "operator"), str(ROOT / "bench")]
            code = (
                f"import sys, json; sys.path[:0] = {paths!r};"
                f"import bench_diagnosis as b; print(json.dumps(b.run_arm({n}, {big})))"
            )
            out = subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True
            )
            result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
            return result
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--big", type=int, default=200)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "diagnosis.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "operator"))
    current = run_arm(args.n, args.big)
    baseline = baseline_arm(args.baseline, args.n, args.big)
    result = {
        "machine": platform.platform(),
        "python": platform.python_version(),
        "n": args.n,
        "big_runs": args.big,
        "baseline_revision": args.baseline,
        "current": current,
        "baseline": baseline,
        "throughput_ratio": current["tail80_per_s"] / baseline["tail80_per_s"],
        "throughput_ratio_per_case": {
            case: current[f"{case}_per_s"] / baseline[f"{case}_per_s"] for case in CASES
        },
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
