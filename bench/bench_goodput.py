"""Goodput under faults: tpujob against JobSet's restart-all, the real CPU JAX trainer on 2 slices.

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
  (`backoffLimit: 0`, `failurePolicy.maxRestarts`), with the same faults.

The faults alternate, starting with a worker killed (SIGKILL to the trainer process), then a node
down (the host's processes die and its network is cut, `tpujob local fault node-down`), repaired
`--repair-after` seconds later as GKE's auto-repair returns a node: up, without the bad-node
taint the operator put on it. Which worker or whose node is drawn from `--seed`, the same for
both arms: the k-th fault hits the same (slice, worker) in each. A fault falls due on its
schedule; while the arm has no running pod for that worker it waits for one.

Goodput of an arm = the last committed checkpoint step after `--minutes` (the newest complete
orbax step folder) / the reference's; both arms are read the same way, from the files. The
tpujob arm's own `status.goodput` is recorded beside it. Writes bench/results/goodput.json and
goodput.png (committed step over time, the faults marked, and each arm's goodput).

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

from bench_recovery import heal_all, repair_node, until  # noqa: E402
from kubernetes import client, config  # noqa: E402
from scale import peers  # noqa: E402

from tpujob.api import GROUP, PLURAL, VERSION, contract, labels, parse_job  # noqa: E402
from tpujob.local import controlplane, faults  # noqa: E402
from tpujob.local.binaries import binary_dir  # noqa: E402
from tpujob.plan import manifests  # noqa: E402

POOLS = controlplane.PoolOptions(
    pools=3, accelerator="tpu-v4-podslice", topology="2x2x2", spare_nodes=1
)
SLICES, HOSTS = 2, 2
TRAINER_ARGS = ["--steps", "10000000", "--step-time", "0.1", "--batch-size", "16"]
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


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
            controller, hooks = peers.jobset(peers.peers_dir(), state_dir, self.kubeconfig, logs)
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


def job_manifest(namespace: str, checkpoints: Path, *, rejoin: bool = True) -> dict[str, Any]:
    # With --no-rejoin the trainer does not run under its supervisor, and says so on its
    # heartbeat: the operator then replaces every pod on every failure.
    args = TRAINER_ARGS if rejoin else [*TRAINER_ARGS, "--no-rejoin"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUTrainingJob",
        "metadata": {"name": "run", "namespace": namespace},
        "spec": {
            "tpu": {"accelerator": POOLS.accelerator, "topology": POOLS.topology, "slices": SLICES},
            "trainer": {
                "image": "local",
                "command": ["tpujob-trainer"],
                "args": args,
                "allowCpuFallback": True,
            },
            "checkpoint": {
                "volume": {"hostPath": str(checkpoints)},
                "intervalSteps": 20,
                "keep": 2,
            },
            "recovery": {
                "maxFailedNodes": SLICES * HOSTS // 2,
                "maxHardRestarts": 100,
                "maxSoftRestarts": 100,
                "maxMediumRestarts": 100,
            },
        },
    }


def jobset_manifest(namespace: str, checkpoints: Path, max_restarts: int) -> dict[str, Any]:
    """The pod tpujob renders for one worker, made generic: each pod works out its slice and
    worker from JobSet's and the Job controller's indexes, as GKE's TPU webhook tells a JobSet
    pod; the operator's heartbeat Lease and fencing are left out (nothing would renew or read
    them), and so is the rejoin order file (no JobSet pod is kept in place)."""
    job = parse_job(job_manifest(namespace, checkpoints, rejoin=False))
    pod = manifests.trainer_pod(job, manifests.AttemptSettings(attempt=1, pools={}), 0, 0)
    container = pod["spec"]["containers"][0]
    per_host = {
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "MEGASCALE_SLICE_ID",
        "MEGASCALE_COORDINATOR_ADDRESS",
        "JAX_COORDINATOR_ADDRESS",
        "JAX_PROCESS_ID",
        contract.ENV_HEARTBEAT_LEASE,
        contract.ENV_JOB_UID,
        contract.ENV_REJOIN_FILE,
    }
    env = [e for e in container["env"] if e["name"] not in per_host]
    env += [
        {
            "name": "SLICE",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX}']"}},
        },
        {
            "name": "WORKER",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
        },
    ]
    host = "run-slice-{slice}-{worker}.run." + namespace + ".svc.cluster.local"
    coordinator = host.format(slice=0, worker=0)
    script = "; ".join(
        [
            "export TPU_WORKER_ID=$WORKER MEGASCALE_SLICE_ID=$SLICE",
            f"export JAX_PROCESS_ID=$(( SLICE * {HOSTS} + WORKER ))",
            "export TPU_WORKER_HOSTNAMES="
            + ",".join(host.format(slice="$SLICE", worker=w) for w in range(HOSTS)),
            f"export JAX_COORDINATOR_ADDRESS={coordinator}:{labels.JAX_COORDINATOR_PORT}",
            f"export MEGASCALE_COORDINATOR_ADDRESS={coordinator}:{labels.MEGASCALE_PORT}",
            'exec "$@"',
        ]
    )
    container.update(
        command=[
            "sh",
            "-c",
            script,
            "trainer",
            *container.get("command", []),
            *container.get("args", []),
        ],
        env=env,
        volumeMounts=[m for m in container["volumeMounts"] if m["name"] != manifests.REJOIN_VOLUME],
    )
    pod["spec"]["volumes"] = [
        v for v in pod["spec"]["volumes"] if v["name"] != manifests.REJOIN_VOLUME
    ]
    container.pop("args", None)
    spec = {
        k: v
        for k, v in pod["spec"].items()
        if k
        not in (
            "hostname",
            "subdomain",
            "affinity",
            "serviceAccountName",
            "automountServiceAccountToken",
        )
    }
    spec["restartPolicy"] = "Never"
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "run",
            "namespace": namespace,
            "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": labels.NODEPOOL},
        },
        "spec": {
            "failurePolicy": {"maxRestarts": max_restarts},
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": SLICES,
                    "template": {
                        "spec": {
                            "parallelism": HOSTS,
                            "completions": HOSTS,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {"spec": spec},
                        }
                    },
                }
            ],
        },
    }


def committed_step(folder: Path) -> int:
    """The newest step orbax committed (a save cut short leaves a `*.orbax-checkpoint-tmp*`)."""
    steps = [int(p.name) for p in folder.glob("*") if p.is_dir() and p.name.isdigit()]
    return max(steps, default=0)


def worker_of(pod: client.V1Pod, arm: str) -> tuple[int, int] | None:
    """(slice, worker) of a trainer pod of either arm."""
    meta = pod.metadata
    try:
        if arm == "jobset":
            return int(meta.labels[JOB_INDEX]), int(meta.annotations[COMPLETION_INDEX])
        return int(meta.labels[labels.SLICE]), int(meta.labels[labels.WORKER])
    except (KeyError, TypeError, ValueError):
        return None


class Faults:
    """The seeded schedule: the k-th fault is the same kind on the same (slice, worker) for
    every arm."""

    def __init__(self, seed: int, count: int, slices: int = SLICES) -> None:
        rng = random.Random(seed)
        self.targets = [(rng.randrange(slices), rng.randrange(HOSTS)) for _ in range(count)]
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
                cluster.state_dir, faults.find_pod(cluster.state_dir, pod.metadata.name, namespace)
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


def run_arm(
    cluster: Cluster, arm: str, a: argparse.Namespace, schedule: Faults | None
) -> dict[str, Any]:
    namespace = cluster.namespace(f"goodput-{arm}")
    folder = cluster.checkpoints / arm
    folder.mkdir()
    if arm == "jobset":
        cluster.custom.create_namespaced_custom_object(
            "jobset.x-k8s.io",
            "v1alpha2",
            namespace,
            "jobsets",
            jobset_manifest(namespace, folder, max_restarts=100),
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
            k, due = k + 1, due + a.fault_every
        time.sleep(0.5)
    step = committed_step(folder)
    steps.append((round(time.monotonic() - start, 1), step))
    result: dict[str, Any] = {
        "committed_step": step,
        "startup_s": round(start - created, 1),
        "faults": injected,
        "committed_over_time": steps,
    }
    if arm == "jobset":
        js = cluster.custom.get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", "run"
        )
        result["restarts"] = (js.get("status") or {}).get("restarts", 0)
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


COLORS = {
    "reference": "0.6",
    "tpujob": "tab:blue",
    "tpujob-full": "tab:cyan",
    "jobset": "tab:orange",
}


def plot(report: dict[str, Any], path: Path) -> None:
    """Committed step over time per arm (when recorded) and each arm's goodput, the faults
    marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    arms = report["arms"]
    for arm, result in arms.items():
        series = result.get("committed_over_time") or []
        if series:
            left.plot(
                [t for t, _ in series], [s for _, s in series], color=COLORS.get(arm), label=arm
            )
        for fault in result.get("faults") or []:
            left.axvline(
                fault["at_s"],
                color=COLORS.get(arm),
                alpha=0.3,
                linestyle="-" if fault["kind"] == "kill" else "--",
            )
    left.set(
        xlabel="seconds since the first committed step",
        ylabel="committed step",
        title="checkpoints (faults: kill solid, node down dashed)",
    )
    if any(r.get("committed_over_time") for r in arms.values()):
        left.legend()
    else:
        left.text(0.5, 0.5, "no time series in this run", ha="center", transform=left.transAxes)
    names = list(arms)
    right.bar(
        names, [arms[n].get("goodput") or 0 for n in names], color=[COLORS.get(n) for n in names]
    )
    right.set(
        ylabel="committed step / reference's",
        ylim=(0, 1.1),
        title=f"goodput after {report['minutes']:g} min, a fault every "
        f"{report['fault_every_s']:g} s",
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0)
    add_fault_arguments(p)
    p.add_argument("--arms", nargs="+", default=["reference", "tpujob", "tpujob-full", "jobset"])
    a = parse_or_replot(p, "goodput.json", plot)
    if a is None:
        return 0
    count = int(a.minutes * 60 // a.fault_every)
    schedule = Faults(a.seed, count)
    command = "python bench/bench_goodput.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    report: dict[str, Any] = {
        "command": command.strip(),
        "minutes": a.minutes,
        "fault_every_s": a.fault_every,
        "repair_after_s": a.repair_after,
        "seed": a.seed,
        "slices": SLICES,
        "hosts_per_slice": HOSTS,
        "trainer_args": TRAINER_ARGS,
        "arms": {},
    }
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="tpujob-goodput-cluster-")))
    try:
        for arm in a.arms:
            print(f"== {arm}", file=sys.stderr, flush=True)
            report["arms"][arm] = run_arm(cluster, arm, a, None if arm == "reference" else schedule)
            print(json.dumps(report["arms"][arm]), file=sys.stderr, flush=True)
    finally:
        cluster.close()
    reference = report["arms"].get("reference", {}).get("committed_step")
    if reference:
        for result in report["arms"].values():
            result["goodput"] = round(result["committed_step"] / reference, 3)
    a.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, a.out.with_suffix(".png"))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
