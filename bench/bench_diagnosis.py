"""Benchmark: diagnoses per second on generated 80-line log tails, against a baseline.

Run as `python bench/bench_diagnosis.py [--n 10000] [--lines 80] [--out FILE]`. The logs are
generated from a fixed seed: training chatter followed by one failure's lines, each failure
with the class it should get. The full engine is timed side by side with a baseline that
sees only the exit code (what most job controllers classify on), and the JSON result holds
both rates, their ratio and each one's accuracy on the generated labels. Not a test: the
numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "operator") not in sys.path:
    sys.path.insert(0, str(ROOT / "operator"))

from tpujob.diagnosis import Diagnosis, FailureClass, WorkerFacts, diagnose_worker  # noqa: E402

SEED = 20260101


@dataclass(frozen=True)
class Failure:
    lines: tuple[str, ...]
    exit_code: int
    label: FailureClass


FAILURES: tuple[Failure, ...] = (
    Failure(
        ("jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer",),
        1,
        FailureClass.SOFT,
    ),
    Failure(
        (
            "XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error.",
            "Ran out of memory in memory space hbm. Used 21.95G of 15.48G hbm.",
        ),
        1,
        FailureClass.FATAL,
    ),
    Failure(
        ("XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: checkpoint-sync",),
        1,
        FailureClass.MEDIUM,
    ),
    Failure(
        ("TypeError: dot_general requires contracting dimensions to have the same shape",),
        1,
        FailureClass.FATAL,
    ),
    Failure(
        ("TPU initialization failed: open(/dev/vfio/0): Device or resource busy",),
        1,
        FailureClass.SOFT,
    ),
    Failure(
        ("*** A program or fatal error occurred ... Physical location: tpu3:pe2:2",),
        134,
        FailureClass.HARD,
    ),
    Failure(("Killed",), 137, FailureClass.MEDIUM),
    Failure(("ImportError: cannot import name 'runtime' from 'torch_xla'",), 1, FailureClass.FATAL),
    Failure(("the node was preempted",), 143, FailureClass.SOFT),
    Failure(("Segmentation fault (core dumped)",), 139, FailureClass.MEDIUM),
)


def chatter(rng: random.Random, step: int) -> str:
    loss = rng.uniform(0.5, 3.0)
    return (
        f"I0101 12:00:{step % 60:02d}.{rng.randrange(10**6):06d} train.py:88] step={step}"
        f" loss={loss:.4f} tokens/s={rng.randrange(10_000, 90_000)} lr=3.0e-04"
    )


def generate(n: int, lines: int, seed: int = SEED) -> list[tuple[WorkerFacts, FailureClass]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        failure = rng.choice(FAILURES)
        start = rng.randrange(100_000)
        body = [chatter(rng, start + i) for i in range(lines - len(failure.lines))]
        text = "\n".join([*body, *failure.lines])
        out.append((WorkerFacts(exit_code=failure.exit_code, log_tail=text), failure.label))
    return out


def exit_code_only(facts: WorkerFacts) -> Diagnosis:
    """The baseline: the same engine, shown nothing but the exit code."""
    return diagnose_worker(WorkerFacts(exit_code=facts.exit_code))


def measure(
    classify: Callable[[WorkerFacts], Diagnosis],
    cases: Sequence[tuple[WorkerFacts, FailureClass]],
) -> dict[str, float]:
    classify(cases[0][0])  # load the rule table outside the timed loop
    start = time.perf_counter()
    verdicts = [classify(facts) for facts, _ in cases]
    seconds = time.perf_counter() - start
    correct = sum(v.failure_class is label for v, (_, label) in zip(verdicts, cases, strict=True))
    return {
        "seconds": round(seconds, 4),
        "diagnoses_per_second": round(len(cases) / seconds, 1),
        "accuracy_on_generated_labels": round(correct / len(cases), 4),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--lines", type=int, default=80)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "diagnosis.json")
    args = parser.parse_args(argv)
    cases = generate(args.n, args.lines)
    engine = measure(diagnose_worker, cases)
    baseline = measure(exit_code_only, cases)
    result = {
        "benchmark": "diagnosis",
        "n": args.n,
        "lines_per_log": args.lines,
        "seed": SEED,
        "python": platform.python_version(),
        "engine": engine,
        "baseline_exit_code_only": baseline,
        "engine_over_baseline_speed": round(
            engine["diagnoses_per_second"] / baseline["diagnoses_per_second"], 4
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
