"""Goodput under faults: tpujob and JobSet's restart modes, the real CPU JAX trainer on 2 slices.

One local cluster (`tpujob local up`: three two-host tpu-v4-podslice 2x2x2 pools, so one spare)
runs, one after the other, each in its own namespace and checkpoint folder:

* `reference`: a TPUTrainingJob of 2 slices that no fault touches;
* `tpujob`: the same job, with a fault every `--fault-every` seconds (a failure of one slice
  replaces that slice's pods; the other slice's trainers restart in place);
* `tpujob-full`: the same, with the trainer told never to restart in place (`--no-rejoin`),
  so every failure replaces every pod, as before slice restarts;
* `jobset`: the same trainer, the same pod (the one tpujob renders, less the operator's
  heartbeat Lease) in a JobSet of 2 replicated Jobs of 2 Indexed pods, placed one Job per pool
  (`alpha.jobset.sigs.k8s.io/exclusive-topology`), restarted whole on any failure
  (`backoffLimit: 0`, `failurePolicy.maxRestarts`), with the same faults;
* `jobset-restartjob`: the same JobSet with one failure-policy rule, `action: RestartJob`
  (JobSet v0.12, alpha gate `RestartJob`): only the failed child Job is recreated;
* `jobset-inplace`: the same JobSet with `restartStrategy: InPlaceRestart` (v0.12, alpha gate
  `InPlaceRestart`): each pod's container is JobSet's in-place restart agent, which runs the
  trainer (its main-container mode); a failed container is restarted by the node, and every
  other pod's agent exits so that its container restarts too, the pods kept; the agents start
  the trainers again once all pods reached the same attempt.

The faults alternate, starting with a worker killed (SIGKILL to its training process, as a crash
or the kernel's OOM killer ends it: the deepest process of the pod's container, which is the
container's main process where nothing supervises it; `--kill container` signals the main
process instead, and so a supervisor or agent with it), then a node down (the host's processes
die and its network is cut, `tpujob local fault node-down`), repaired `--repair-after` seconds
later as GKE's auto-repair returns a node: up, without the bad-node taint the operator put on
it. Which worker or whose node is drawn from `--seed`, the same for every arm: the k-th fault
hits the same (slice, worker) in each. A fault falls due on its schedule; while the arm has no
running pod for that worker it waits for one.

Goodput of an arm = the last committed checkpoint step after `--minutes` (the newest complete
orbax step folder) / the reference's; every arm is read the same way, from the files. The
tpujob arm's own `status.goodput` is recorded beside it. Each fault's lost seconds are cut
from the trainers' log lines and a watch of the arm's pods (`lost_seconds.py`,
`fault_timeline.py`): detection, restart, start-up, restore, first step, steps done again.
Beside them the limit, measured on the same machine after the runs: the job's 4 trainer
processes started at once as one JAX world (its coordinator on loopback) on a copy of the
reference's checkpoint folder, to the first step (`bench_in_place.limit_run`): a restart that
keeps no process cannot do it faster here, and JAX's world cannot take back one process alone.
One process alone is recorded beside it.
With `--runs N` every arm runs N times (arms interleaved) and the summary gives medians.
Writes bench/results/goodput.json and goodput.png (committed step over time, the faults
marked; each arm's goodput; the lost seconds per fault kind).

    python bench/bench_goodput.py                       # 10 minutes per arm, a fault every 120 s
    python bench/bench_goodput.py --minutes 3 --fault-every 60 --out /tmp/goodput.json

Needs root (pod network namespaces), the binaries of `make binaries` and the bench peers
(`tools/build-bench-peers.sh`).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "bench")]

from bench_in_place import limit_run  # noqa: E402
from bench_recovery import heal_all, repair_node, until  # noqa: E402
from fault_timeline import PodWatch, trainer_lines  # noqa: E402
from goodput_report import median, plot, summarize  # noqa: E402
from goodput_workloads import (  # noqa: E402
    COMPLETION_INDEX,
    HOSTS,
    JOB_INDEX,
    JOBSET_MODES,
    POOLS,
    SLICES,
    TRAINER_ARGS,
    TRAINER_OPTIONS,
    agent_role,
    job_manifest,
    jobset_manifest,
)
from kubernetes import client, config  # noqa: E402
from lost_seconds import breakdown, seconds_per_step  # noqa: E402
from scale import peers  # noqa: E402

from tpujob.api import GROUP, PLURAL, VERSION, contract, labels  # noqa: E402
from tpujob.local import controlplane, faults  # noqa: E402
from tpujob.local.binaries import binary_dir  # noqa: E402

JOBSET_GATES = {"RestartJob": True, "InPlaceRestart": True}
# Pod annotations through which a controller (or JobSet's agent) orders a restart in place.
ORDERS = (contract.POD_REJOIN_ANNOTATION, "jobset.sigs.k8s.io/in-place-restart-attempt")


class Cluster:
    """The local cluster with the operator and JobSet both running (each ignores the other's
    objects); `jobset=False` runs the operator alone (the soak, bench_soak.py)."""

    def __init__(
        self, state_dir: Path, pools: controlplane.PoolOptions = POOLS, *, jobset: bool = True
    ) -> None:
        self.state_dir = state_dir
        controlplane.up(state_dir, pools, out=sys.stderr)
        self.kubeconfig = state_dir / "kubeconfig"
        logs = state_dir / "logs"
        self.kubectl("apply", "--server-side", "-f", str(ROOT / "crds"))
        self.procs = [peers.operator(self.kubeconfig, logs)]
        if jobset:
            self.kubectl(
                "apply", "--server-side", "--force-conflicts", "-f", str(peers.jobset_crd())
            )
            controller, hooks = peers.jobset(
                peers.peers_dir(), state_dir, self.kubeconfig, logs, feature_gates=JOBSET_GATES
            )
            self.procs.append(controller)
            time.sleep(5)  # its webhook server up before the API server is told to call it
            self.kubectl(
                "apply",
                "-f",
                "-",
                stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": hooks}),
            )
        api = config.new_client_from_config(str(self.kubeconfig))
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.checkpoints = Path(tempfile.mkdtemp(prefix="tpujob-goodput-"))

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return subprocess.run(
            [str(binary_dir() / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def close(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        controlplane.down(self.state_dir, purge=True)

    def namespace(self, name: str) -> str:
        self.core.create_namespace({"metadata": {"name": name}})
        until(lambda: self.core.list_namespaced_service_account(name).items, 30)
        return name

    def repair(self, name: str) -> None:
        repair_node(self.core, self.state_dir, name)

    def heal(self) -> None:
        heal_all(self.core, self.state_dir)


def committed_step(folder: Path) -> int:
    """The newest step orbax committed (a save cut short leaves a `*.orbax-checkpoint-tmp*`)."""
    steps = [int(p.name) for p in folder.glob("*") if p.is_dir() and p.name.isdigit()]
    return max(steps, default=0)


def worker_of(pod: client.V1Pod, arm: str) -> tuple[int, int] | None:
    """(slice, worker) of a trainer pod of either arm."""
    meta = pod.metadata
    try:
        if arm in JOBSET_MODES:
            return int(meta.labels[JOB_INDEX]), int(meta.annotations[COMPLETION_INDEX])
        return int(meta.labels[labels.SLICE]), int(meta.labels[labels.WORKER])
    except (KeyError, TypeError, ValueError):
        return None


class Faults:
    """The seeded schedule: the k-th fault is the same kind on the same (slice, worker) for
    every arm."""

    def __init__(self, seed: int, count: int, slices: int = SLICES, *, leaf: bool = True) -> None:
        rng = random.Random(seed)
        self.targets = [(rng.randrange(slices), rng.randrange(HOSTS)) for _ in range(count)]
        self.leaf = leaf  # kill the training process, not the container's main one
        self.repairs: list[threading.Timer] = []

    def cancel_repairs(self) -> None:
        """Repairs still pending when an arm ends: its `heal` repairs every node instead."""
        for repair in self.repairs:
            repair.cancel()
        self.repairs.clear()

    def inject(
        self,
        cluster: Cluster,
        namespace: str,
        arm: str,
        k: int,
        *,
        repair_after: float,
        log: list[dict[str, Any]],
    ) -> bool:
        """Inject fault k when the arm has that worker running; False while it has not."""
        target = self.targets[k]
        running = [
            p
            for p in cluster.core.list_namespaced_pod(namespace).items
            if p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
            and worker_of(p, arm) == target
        ]
        if not running:
            return False
        pod = running[0]
        kind = "kill" if k % 2 == 0 else "node-down"
        if kind == "kill":
            faults.kill_pod(
                cluster.state_dir,
                faults.find_pod(cluster.state_dir, pod.metadata.name, namespace),
                leaf=self.leaf,
            )
        else:
            node = pod.spec.node_name
            faults.set_node_fault(cluster.state_dir, node, down=True)
            repair = threading.Timer(repair_after, cluster.repair, (node,))
            repair.daemon = True
            repair.start()
            self.repairs.append(repair)
        log.append(
            {
                "k": k,
                "kind": kind,
                "slice": target[0],
                "worker": target[1],
                "pod": pod.metadata.name,
                "node": pod.spec.node_name,
            }
        )
        return True


def agent_access(cluster: Cluster, namespace: str) -> None:
    """The Role JobSet's in-place restart agent needs, bound to the pods' service account."""
    items = agent_role(namespace)
    cluster.kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )


def lost_per_fault(
    cluster: Cluster,
    namespace: str,
    faults_seen: list[dict[str, Any]],
    reactions: PodWatch,
    end: float,
) -> tuple[list[dict[str, Any] | None], float | None]:
    """Each fault's lost seconds (None: not recovered before the next fault or the end) and
    the run's seconds per step."""
    lines = trainer_lines(cluster.state_dir, namespace)
    pace = seconds_per_step(lines)
    out: list[dict[str, Any] | None] = []
    for i, fault in enumerate(faults_seen):
        until_t = faults_seen[i + 1]["at_wall"] if i + 1 < len(faults_seen) else end
        lost = breakdown(
            lines,
            fault["at_wall"],
            until_t,
            SLICES * HOSTS,
            pace or 0.0,
            reaction_at=reactions.reaction_after(fault["at_wall"]),
        )
        out.append(None if lost is None else {"kind": fault["kind"], **lost.as_dict()})
    return out, pace


def run_arm(
    cluster: Cluster, arm: str, a: argparse.Namespace, schedule: Faults | None, run: int = 0
) -> dict[str, Any]:
    namespace = cluster.namespace(f"goodput-{arm}-{run}")
    folder = cluster.checkpoints / f"{arm}-{run}"
    folder.mkdir()
    reactions = PodWatch(cluster.core, namespace, annotations=ORDERS)
    if arm in JOBSET_MODES:
        if arm == "jobset-inplace":
            agent_access(cluster, namespace)
        cluster.custom.create_namespaced_custom_object(
            "jobset.x-k8s.io",
            "v1alpha2",
            namespace,
            "jobsets",
            jobset_manifest(namespace, folder, max_restarts=100, arm=arm),
        )
    else:
        cluster.custom.create_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            job_manifest(namespace, folder, rejoin=arm != "tpujob-full"),
        )
    created = time.monotonic()
    # The clock starts when the first step is committed: start-up (JAX on CPU, the first
    # compile) is the same for every arm and not what this compares.
    until(lambda: committed_step(folder) > 0, 600, interval=0.5)
    start = time.monotonic()
    injected: list[dict[str, Any]] = []
    steps: list[tuple[float, int]] = []  # (seconds, committed step), every 5 s
    k, due, sample = 0, start + a.fault_every, start
    while (now := time.monotonic()) - start < a.minutes * 60:
        if now >= sample:
            steps.append((round(now - start, 1), committed_step(folder)))
            sample += 5.0
        if (
            schedule is not None
            and now >= due
            and k < len(schedule.targets)
            and schedule.inject(
                cluster, namespace, arm, k, repair_after=a.repair_after, log=injected
            )
        ):
            injected[-1]["at_s"] = round(now - start, 1)
            injected[-1]["at_wall"] = time.time()
            k, due = k + 1, due + a.fault_every
        time.sleep(0.5)
    step = committed_step(folder)
    steps.append((round(time.monotonic() - start, 1), step))
    lost, pace = lost_per_fault(cluster, namespace, injected, reactions, time.time())
    reactions.close()
    result: dict[str, Any] = {
        "committed_step": step,
        "startup_s": round(start - created, 1),
        "faults": injected,
        "lost": lost,
        "seconds_per_step": None if pace is None else round(pace, 4),
        "committed_over_time": steps,
    }
    if arm in JOBSET_MODES:
        js = cluster.custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "run"
        )
        js_status = js.get("status") or {}
        # Whole restarts, child Jobs recreated alone (RestartJob), in-place attempts.
        result["restarts"] = js_status.get("restarts", 0)
        result["job_restarts"] = sum(
            sum(r.get("jobRestarts") or []) for r in js_status.get("replicatedJobsStatus") or []
        )
        result["in_place_attempt"] = js_status.get("currentInPlaceRestartAttempt")
        result["terminal_state"] = js_status.get("terminalState")
        cluster.custom.delete_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "run"
        )
    else:
        status = (
            cluster.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "run"
            ).get("status")
            or {}
        )
        result["status_goodput"] = status.get("goodput")
        result["restarts"] = status.get("restarts")
        cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "run")
    if schedule is not None:
        schedule.cancel_repairs()
    cluster.heal()  # first: pods on a node still down could not finish terminating
    cluster.core.delete_namespace(namespace)
    until(lambda: not cluster.core.list_namespaced_pod(namespace).items, 180, interval=1)
    return result


def parse_or_replot(
    p: argparse.ArgumentParser, out: str, plot: Callable[[dict[str, Any], Path], None]
) -> argparse.Namespace | None:
    """The arguments, with `--out` (bench/results/OUT by default) and `--replot` added; None
    when `--replot` asked only for the plot of a results file, drawn next to it."""
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / out)
    p.add_argument(
        "--replot",
        type=Path,
        default=None,
        help="only draw the plot of this results file (next to it, as .png)",
    )
    a = p.parse_args()
    if a.replot is None:
        return a
    plot(json.loads(a.replot.read_text()), a.replot.with_suffix(".png"))
    return None


def add_fault_arguments(p: argparse.ArgumentParser) -> None:
    """The fault schedule's options: how often, how long a node stays down, the seed."""
    p.add_argument("--fault-every", type=float, default=120.0)
    p.add_argument(
        "--repair-after",
        type=float,
        default=60.0,
        help="seconds a downed node stays down (then it comes back, as repaired)",
    )
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument(
        "--kill",
        choices=["process", "container"],
        default="process",
        help="what a worker kill signals: the training process (the deepest process of the "
        "pod's container: under a supervisor or agent, its child), or the container's main "
        "process",
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    add_fault_arguments(p)
    p.add_argument(
        "--arms",
        nargs="+",
        default=["reference", "tpujob", "jobset", "jobset-restartjob", "jobset-inplace"],
        choices=["reference", "tpujob", "tpujob-full", *JOBSET_MODES],
    )
    p.add_argument("--runs", type=int, default=1, help="runs per arm, the arms interleaved")
    p.add_argument("--limit-runs", type=int, default=3, help="measurements of the limit")
    a = parse_or_replot(p, "goodput.json", plot)
    if a is None:
        return 0
    count = int(a.minutes * 60 // a.fault_every)
    schedule = Faults(a.seed, count, leaf=a.kill == "process")
    command = "python bench/bench_goodput.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    report: dict[str, Any] = {
        "command": command.strip(),
        "minutes": a.minutes,
        "fault_every_s": a.fault_every,
        "repair_after_s": a.repair_after,
        "seed": a.seed,
        "kill": a.kill,
        "slices": SLICES,
        "hosts_per_slice": HOSTS,
        "trainer_args": TRAINER_ARGS,
        "jobset_version": peers.JOBSET_VERSION,
        "runs": [],
        "arms": {},
    }
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="tpujob-goodput-cluster-")))
    try:
        for run in range(a.runs):
            results: dict[str, Any] = {}
            report["runs"].append(results)
            for arm in a.arms:
                print(f"== {arm} (run {run + 1} of {a.runs})", file=sys.stderr, flush=True)
                result = run_arm(cluster, arm, a, None if arm == "reference" else schedule, run)
                results[arm] = result
                print(
                    json.dumps({k: v for k, v in result.items() if k != "committed_over_time"}),
                    file=sys.stderr,
                    flush=True,
                )
            reference = results.get("reference", {}).get("committed_step")
            for result in results.values():
                if reference:
                    result["goodput"] = round(result["committed_step"] / reference, 3)
            a.out.write_text(json.dumps(report, indent=2) + "\n")  # each run kept as it ends
        # The limit: the job's processes started at once on a copy of a run's checkpoints.
        first = "reference" if "reference" in a.arms else a.arms[0]
        folder = cluster.checkpoints / f"{first}-0"
        world = [
            limit_run(folder, 10_000_000, TRAINER_OPTIONS, processes=SLICES * HOSTS)
            for _ in range(a.limit_runs)
        ]
        one = [limit_run(folder, 10_000_000, TRAINER_OPTIONS) for _ in range(a.limit_runs)]
        report.update(limit_runs_s=world, limit_s=median(world))
        report.update(one_process_limit_runs_s=one, one_process_limit_s=median(one))
    finally:
        cluster.close()
    report["arms"] = {arm: summarize(report["runs"], arm) for arm in a.arms}
    a.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, a.out.with_suffix(".png"))
    print(json.dumps(report["arms"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
