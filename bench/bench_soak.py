"""Soak: the operator's memory and open files over a long run of real jobs, faults and restarts.

Scenario (d) of the scale benchmark. One local cluster (`tpujob local up`: `--jobs` + 1
two-host tpu-v4-podslice 2x2x2 pools, so one spare) runs the operator alone (no JobSet) and
`--jobs` job slots, each in its own namespace. A slot holds one TPUTrainingJob of one slice of
two hosts, the real CPU JAX trainer with bench_goodput.py's arguments but `--job-steps` steps;
when the job ends (Succeeded or Failed) it is deleted and created again under a new name
(`job-1`, `job-2`, ...) with an empty checkpoint folder, so the operator sees a steady churn of
jobs, pods and watches for `--minutes`.

A fault falls due every `--fault-every` seconds, bench_goodput.py's schedule: a worker killed,
then a node down repaired `--repair-after` seconds later, alternating; the (slice, worker) of
the k-th fault comes from `--seed`, and so does its slot (its own generator). A fault waits for
its slot's job to have that worker running.

Measured:
* the operator process's RSS (VmRSS of /proc/PID/status) and open file descriptors
  (/proc/PID/fd) every `--sample-every` seconds, and the least-squares slope of each over the
  run less its first 10 % (the warm-up: caches and connection pools filling);
* goodput per job: the committed checkpoint step (the newest complete orbax step folder, as
  bench_goodput.py reads it) per job life and per slot, and the operator's `status.goodput`;
* every fault recovered: the job it hit, when, and when that job's status showed a later
  attempt resumed (its heartbeat on the new attempt) or Succeeded, or "not recovered" when
  neither came before the run ended plus `--recover-within` seconds.

Writes bench/results/soak.json and soak.png (RSS and fds over time, the faults marked).

    python bench/bench_soak.py                                   # an hour, 4 jobs
    python bench/bench_soak.py --minutes 5 --fault-every 60 --jobs 2 --out /tmp/soak.json

Needs root (pod network namespaces) and the binaries of `make binaries`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "bench")]

from bench_goodput import Cluster, Faults, add_fault_arguments, committed_step, parse_or_replot  # noqa: E402
from goodput_workloads import HOSTS, POOLS, TRAINER_ARGS, job_manifest  # noqa: E402
from kubernetes import client  # noqa: E402
from scale import measure  # noqa: E402

from tpujob.api import GROUP, PLURAL, VERSION  # noqa: E402

WARMUP = 0.1  # the share of the run left out of the slopes
FINISHED = ("Succeeded", "Failed")


def slope_per_hour(samples: Sequence[tuple[float, float]], warmup: float = WARMUP) -> float | None:
    """Least-squares slope of (seconds, value) samples, in value per hour, over the samples
    after the first `warmup` share of their time span; None with fewer than two left."""
    if not samples:
        return None
    first, last = samples[0][0], samples[-1][0]
    kept = [(t, v) for t, v in samples if t >= first + warmup * (last - first)]
    try:
        fit = statistics.linear_regression([t for t, _ in kept], [v for _, v in kept])
    except statistics.StatisticsError:  # fewer than two samples, or all at one instant
        return None
    return 3600 * fit.slope


def process_usage(pid: int) -> tuple[float, int] | None:
    """(RSS in MiB, open file descriptors) of a process; None once it has exited."""
    usage = measure.proc(pid)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return (usage.rss_mib, fds) if usage is not None else None


def trainer_args(steps: int) -> list[str]:
    """bench_goodput.py's trainer arguments, `steps` steps long."""
    args = list(TRAINER_ARGS)
    args[args.index("--steps") + 1] = str(steps)
    return args


def soak_manifest(namespace: str, name: str, folder: Path, steps: int) -> dict[str, Any]:
    """bench_goodput.py's job, one slice and `steps` steps long, so it ends and is replaced."""
    job = job_manifest(namespace, folder)
    job["metadata"]["name"] = name
    spec = job["spec"]
    spec["tpu"]["slices"] = 1
    spec["trainer"].update(args=trainer_args(steps), totalSteps=steps)
    # The API refuses more than half of the job's hosts.
    spec["recovery"]["maxFailedNodes"] = HOSTS // 2
    return job


@dataclasses.dataclass
class Slot:
    """One place a job runs in, its own namespace: a fault's (slice, worker) names a pod of this
    slot's job only. `name`, `folder` and `created_s` are those of the job now running."""

    index: int
    namespace: str
    lives: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    name: str = ""
    folder: Path = Path()
    created_s: float = 0.0


def start_job(cluster: Cluster, slot: Slot, now_s: float, steps: int) -> None:
    slot.name = f"job-{len(slot.lives) + 1}"
    slot.folder = cluster.checkpoints / slot.namespace / slot.name
    slot.folder.mkdir(parents=True)
    slot.created_s = now_s
    cluster.custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        slot.namespace,
        PLURAL,
        soak_manifest(slot.namespace, slot.name, slot.folder, steps),
    )


def job_status(cluster: Cluster, slot: Slot) -> dict[str, Any]:
    try:
        body = cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, slot.namespace, PLURAL, slot.name
        )
    except client.exceptions.ApiException:
        return {}  # a moment's error: read again on the next pass
    return dict(body.get("status") or {})


def record_life(slot: Slot, status: dict[str, Any], now_s: float) -> None:
    """The job now in the slot, as it stands: its committed steps over its lifetime."""
    lifetime = now_s - slot.created_s
    step = committed_step(slot.folder)
    slot.lives.append(
        {
            "job": slot.name,
            "created_s": round(slot.created_s, 1),
            "ended_s": round(now_s, 1),
            "phase": status.get("phase"),
            "attempt": status.get("attempt"),
            "committed_step": step,
            "lifetime_s": round(lifetime, 1),
            "committed_steps_per_s": round(step / lifetime, 3) if lifetime > 0 else None,
            "status_goodput": status.get("goodput"),
            "restarts": status.get("restarts"),
        }
    )


def recovered(status: dict[str, Any], attempt_at_fault: int) -> bool:
    """A later attempt than the one the fault hit has resumed training, or the job succeeded
    after one."""
    if (status.get("attempt") or 0) <= attempt_at_fault:
        return False
    resumed = (status.get("currentAttempt") or {}).get("resumedStep") is not None
    return resumed or status.get("phase") == "Succeeded"


def settle_faults(
    pending: list[dict[str, Any]], statuses: dict[int, dict[str, Any]], now_s: float
) -> None:
    """Mark the pending faults whose job has recovered, or has ended without; drop them from
    `pending` (a pending fault's job is always its slot's current one)."""
    for fault in list(pending):
        status = statuses.get(fault["slot"], {})
        if recovered(status, fault["attempt"]):
            fault.update(
                outcome="recovered",
                recovered_at_s=round(now_s, 1),
                recovery_s=round(now_s - fault["at_s"], 1),
            )
        elif status.get("phase") in FINISHED:
            reason = (status.get("lastFailure") or {}).get("summary")
            fault.update(
                outcome=f"not recovered: the job ended {status['phase']} on attempt "
                f"{status.get('attempt')} ({reason})"
            )
        else:
            continue
        pending.remove(fault)


def summary(
    samples: list[list[float]], faults: list[dict[str, Any]], slots: list[Slot], run_s: float
) -> dict[str, Any]:
    rss = [(t, r) for t, r, _ in samples]
    fds = [(t, f) for t, _, f in samples]
    times = [f["recovery_s"] for f in faults if f.get("outcome") == "recovered"]
    per_slot = {}
    for slot in slots:
        steps = sum(life["committed_step"] for life in slot.lives)
        per_slot[slot.namespace] = {
            "jobs": len(slot.lives),
            "succeeded": sum(life["phase"] == "Succeeded" for life in slot.lives),
            "committed_steps": steps,
            "committed_steps_per_s": round(steps / run_s, 3) if run_s > 0 else None,
        }
    return {
        "rss_mib_per_hour": _round(slope_per_hour(rss)),
        "fds_per_hour": _round(slope_per_hour(fds)),
        "rss_mib": _range([r for _, r in rss]),
        "fds": _range([f for _, f in fds]),
        "faults_injected": len(faults),
        "faults_recovered": len(times),
        "recovery_s": {
            "p50": _round(statistics.median(times)) if times else None,
            "max": max(times, default=None),
        },
        "per_slot": per_slot,
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _range(values: list[float]) -> dict[str, float | None]:
    return {
        "first": _round(values[0]) if values else None,
        "last": _round(values[-1]) if values else None,
        "max": _round(max(values, default=None)),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    """RSS and open fds of the operator over time, the warm-up shaded, the faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    fig, rss_axis = plt.subplots(figsize=(12, 4.5))
    fds_axis = rss_axis.twinx()
    times = [s[0] for s in samples]
    rss_axis.plot(times, [s[1] for s in samples], color="tab:blue", label="RSS (MiB)")
    fds_axis.plot(times, [s[2] for s in samples], color="tab:orange", label="open fds")
    if times:
        rss_axis.axvspan(
            times[0],
            times[0] + WARMUP * (times[-1] - times[0]),
            color="0.9",
            label="warm-up (left out of the slopes)",
        )
    for fault in report["faults"]:
        rss_axis.axvline(
            fault["at_s"],
            alpha=0.5,
            color="0.4" if fault.get("outcome") == "recovered" else "tab:red",
            linestyle="-" if fault["kind"] == "kill" else "--",
        )
    rss_axis.set(xlabel="seconds since the first jobs were created", ylabel="RSS (MiB)")
    fds_axis.set_ylabel("open file descriptors")
    s = report["summary"]
    rss_axis.set_title(
        f"operator over {report['minutes']:g} min, {report['jobs']} jobs; slopes after the "
        f"warm-up: RSS {s['rss_mib_per_hour']} MiB/h, fds {s['fds_per_hour']} /h\n"
        f"faults: kill solid, node down dashed; red: not recovered",
        fontsize=10,
    )
    lines = rss_axis.get_legend_handles_labels()
    more = fds_axis.get_legend_handles_labels()
    rss_axis.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower right")
    rss_axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def soak(cluster: Cluster, a: argparse.Namespace) -> dict[str, Any]:
    """Run the slots for `--minutes`, injecting the faults; then the report's measured parts."""
    count = int(a.minutes * 60 // a.fault_every)
    schedule = Faults(a.seed, count, slices=1, leaf=a.kill == "process")
    slot_draws = random.Random(a.seed)
    fault_slots = [slot_draws.randrange(a.jobs) for _ in range(count)]
    pid = cluster.procs[0].pid  # peers.operator: the operator's own Python process
    slots = [Slot(i, cluster.namespace(f"soak-{i}")) for i in range(a.jobs)]
    start = time.monotonic()
    for slot in slots:
        start_job(cluster, slot, 0.0, a.job_steps)
    samples: list[list[float]] = []  # [seconds, RSS MiB, open fds]
    faults: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    k, due, sample_due = 0, a.fault_every, 0.0
    operator_exit: float | None = None
    while (now := time.monotonic() - start) < a.minutes * 60:
        if now >= sample_due:
            usage = process_usage(pid)
            if usage is None:
                operator_exit = now
                break
            samples.append([round(now, 1), round(usage[0], 2), usage[1]])
            sample_due += a.sample_every
        statuses = {s.index: job_status(cluster, s) for s in slots}
        settle_faults(pending, statuses, now)  # before a finished job is replaced
        for slot in slots:
            status = statuses[slot.index]
            if status.get("phase") in FINISHED:
                record_life(slot, status, now)
                cluster.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, slot.namespace, PLURAL, slot.name
                )
                start_job(cluster, slot, now, a.job_steps)
        if k < count and now >= due:
            slot = slots[fault_slots[k]]
            attempt = statuses[slot.index].get("attempt") or 0
            if schedule.inject(
                cluster, slot.namespace, "tpujob", k, repair_after=a.repair_after, log=faults
            ):
                faults[-1].update(
                    at_s=round(now, 1),
                    slot=slot.index,
                    job=slot.name,
                    attempt=attempt,
                    outcome="not recovered",
                )
                pending.append(faults[-1])
                print(
                    f"{now:6.0f}s fault {k}: {faults[-1]['kind']} {faults[-1]['pod']}",
                    file=sys.stderr,
                    flush=True,
                )
                k, due = k + 1, due + a.fault_every
        time.sleep(1.0)
    run_s = time.monotonic() - start
    for slot in slots:
        record_life(slot, job_status(cluster, slot), run_s)
        slot.lives[-1]["ended_s"] = None  # still running when the run ended
    # Faults near the end get `--recover-within` more seconds; nothing else happens then.
    deadline = run_s + a.recover_within
    while pending and operator_exit is None and (now := time.monotonic() - start) < deadline:
        settle_faults(pending, {s.index: job_status(cluster, s) for s in slots}, now)
        time.sleep(1.0)
    schedule.cancel_repairs()
    return {
        "operator_exited_at_s": operator_exit,
        "run_s": round(run_s, 1),
        "summary": summary(samples, faults, slots, run_s),
        "samples": samples,
        "faults": faults,
        "jobs_by_slot": {s.namespace: s.lives for s in slots},
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--jobs", type=int, default=4, help="job slots, each a job of 2 hosts")
    p.add_argument(
        "--job-steps",
        type=int,
        default=600,
        help="steps of each job (then it is deleted and created again)",
    )
    add_fault_arguments(p)
    p.add_argument(
        "--sample-every",
        type=float,
        default=10.0,
        help="seconds between readings of the operator's RSS and fds",
    )
    p.add_argument(
        "--recover-within",
        type=float,
        default=120.0,
        help="seconds after the run that faults still pending may recover in",
    )
    a = parse_or_replot(p, "soak.json", plot)
    if a is None:
        return 0
    pools = dataclasses.replace(POOLS, pools=a.jobs + 1)
    command = "python bench/bench_soak.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    report: dict[str, Any] = {
        "command": command.strip(),
        "minutes": a.minutes,
        "jobs": a.jobs,
        "job_steps": a.job_steps,
        "fault_every_s": a.fault_every,
        "repair_after_s": a.repair_after,
        "sample_every_s": a.sample_every,
        "recover_within_s": a.recover_within,
        "seed": a.seed,
        "kill": a.kill,
        "warmup_fraction": WARMUP,
        "pools": dataclasses.asdict(pools),
        "hosts_per_job": HOSTS,
        "trainer_args": trainer_args(a.job_steps),
        "machine_cores": os.cpu_count(),
    }
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="tpujob-soak-cluster-")), pools, jobset=False)
    try:
        report.update(soak(cluster, a))
    finally:
        cluster.close()
        shutil.rmtree(cluster.checkpoints, ignore_errors=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, a.out.with_suffix(".png"))
    print(json.dumps(report["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
