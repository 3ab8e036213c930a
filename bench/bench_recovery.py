"""Recovery benchmark on the local cluster, each figure against a baseline run side by side.

* diagnosis latency: a pod's terminal status reaching the API server -> the operator's
  FailureDiagnosed Event; baseline: the same -> the built-in Job controller's Failed condition
  for a failing Job pod, in the same cluster at the same time.
* node loss: node NotReady -> the replacement slice's pods all Running; baseline: the same node
  loss -> the replacement of a Deployment's pod that ran on that node (taint eviction).
* goodput: a run with a fault every `--fault-every` seconds (a worker killed, then a node
  down, alternating), against the same run without faults.

Writes bench/results/recovery.json. Needs root (pod network namespaces) and the binaries that
`make binaries` builds. Example: `python bench/bench_recovery.py --repeats 5 --minutes 10`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))

from kubernetes import client, config, watch  # noqa: E402

from tpujob.api import GROUP, PLURAL, VERSION, labels  # noqa: E402
from tpujob.local import controlplane, faults  # noqa: E402
from tpujob.local.binaries import binary_dir  # noqa: E402

POOLS = controlplane.PoolOptions(
    pools=3, accelerator="tpu-v4-podslice", topology="2x2x2", spare_nodes=1
)
OPERATOR_ARGS = [
    "--metrics-port",
    "0",
    "--liveness-port",
    "0",
    "--collective-timeout",
    "15",
    "--force-delete-after",
    "3",
    "--restart-grace",
    "3",
]
MERGE = "application/merge-patch+json"


def cluster_with_crds(state_dir: Path, pools: controlplane.PoolOptions) -> Path:
    """The local control plane with `pools`, the CRDs applied; its kubeconfig."""
    controlplane.up(state_dir, pools, out=sys.stderr)
    kubeconfig = state_dir / "kubeconfig"
    subprocess.run(
        [
            str(binary_dir() / "kubectl"),
            "--kubeconfig",
            str(kubeconfig),
            "apply",
            "--server-side",
            "-f",
            str(ROOT / "crds"),
        ],
        check=True,
        capture_output=True,
    )
    return kubeconfig


class Bench:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.kubeconfig = cluster_with_crds(state_dir, POOLS)
        log = open(state_dir / "operator.log", "ab")  # noqa: SIM115 - the child owns it
        self.operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpujob.cli",
                "operator",
                "--kubeconfig",
                str(self.kubeconfig),
                *OPERATOR_ARGS,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "operator")},
        )
        api = config.new_client_from_config(str(self.kubeconfig))
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.checkpoints = Path(tempfile.mkdtemp(prefix="tpujob-bench-"))
        time.sleep(3)

    def close(self) -> None:
        self.operator.terminate()
        self.operator.wait(timeout=20)
        controlplane.down(self.state_dir, purge=True)

    def namespace(self, name: str) -> str:
        self.core.create_namespace({"metadata": {"name": name}})
        until(
            lambda: _exists(lambda: self.core.read_namespaced_service_account("default", name)), 30
        )
        return name

    def job(self, namespace: str, name: str, *, steps: int, args: list[str]) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TPUTrainingJob",
            "metadata": {"name": name},
            "spec": {
                "tpu": {"accelerator": POOLS.accelerator, "topology": POOLS.topology},
                "trainer": {
                    "image": "local",
                    "command": ["tpujob-trainer"],
                    "args": [
                        "--steps",
                        str(steps),
                        "--step-time",
                        "0.1",
                        "--batch-size",
                        "16",
                        *args,
                    ],
                    "allowCpuFallback": True,
                    "totalSteps": steps,
                },
                "checkpoint": {
                    "volume": {"hostPath": str(self.checkpoints / namespace / name)},
                    "intervalSteps": 20,
                    "keep": 2,
                },
                "recovery": {
                    "maxFailedNodes": 1,
                    "maxHardRestarts": 100,
                    "maxSoftRestarts": 100,
                    "backoff": {"initialSeconds": 1, "maxSeconds": 4},
                    "stallTimeoutSeconds": 30,
                },
            },
        }
        self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        body = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return dict(body.get("status") or {})

    def heal_all(self) -> None:
        heal_all(self.core, self.state_dir)


def repair_node(core: client.CoreV1Api, state_dir: Path, name: str) -> None:
    """The node back as GKE's auto-repair returns one: up, and without the taint the operator
    put on the broken one (a recreated VM has none)."""
    faults.set_node_fault(state_dir, name, down=False)
    node = core.read_node(name)
    kept = [
        {
            k: v
            for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect))
            if v is not None
        }
        for t in node.spec.taints or []
        if t.key != labels.BAD_NODE_TAINT
    ]
    core.patch_node(name, {"spec": {"taints": kept or None}}, _content_type=MERGE)


def heal_all(core: client.CoreV1Api, state_dir: Path, timeout: float = 180) -> None:
    """Every node repaired, then Ready and without the node controller's taints."""
    for node in core.list_node().items:
        repair_node(core, state_dir, node.metadata.name)

    def ready() -> bool:
        return all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            and not any(t.key.startswith("node.kubernetes.io/") for t in n.spec.taints or [])
            for n in core.list_node().items
        )

    until(ready, timeout, interval=1)


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except client.exceptions.ApiException:
        return False
    return True


def until(check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(interval)
    raise TimeoutError(f"condition not met in {timeout}s")


class Stamps:
    """Local arrival times of watch events, recorded by a background thread."""

    def __init__(
        self, stream: Callable[..., Any], key: Callable[[Any], str | None], **kwargs: Any
    ) -> None:
        self.times: dict[str, float] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, args=(stream, key, kwargs), daemon=True)
        self._thread.start()

    def _run(
        self, stream: Callable[..., Any], key: Callable[[Any], str | None], kwargs: dict[str, Any]
    ) -> None:
        while not self._stop:
            try:
                for event in watch.Watch().stream(stream, timeout_seconds=30, **kwargs):
                    name = key(event["object"])
                    if name and name not in self.times:
                        self.times[name] = time.monotonic()
            except Exception:  # a watch may expire; the next loop re-lists
                time.sleep(0.1)

    def stop(self) -> None:
        self._stop = True


def attempts(
    run: Callable[[int], tuple[float, float]], repeats: int, errors: list[str]
) -> list[tuple[float, float]]:
    """Repeat a measurement; a run that fails is reported, not allowed to end the benchmark."""
    results = []
    for i in range(repeats):
        try:
            results.append(run(i))
        except Exception as err:
            errors.append(f"{getattr(run, '__name__', 'run')} #{i}: {err!r}")
    return results


def diagnosis_latency(bench: Bench, repeats: int, errors: list[str]) -> dict[str, Any]:
    runs = attempts(lambda i: one_latency_run(bench, i), repeats, errors)
    return summary(
        "pod Failed -> FailureDiagnosed Event (s)",
        [r[0] for r in runs],
        "pod Failed -> Job controller Failed condition (s)",
        [r[1] for r in runs],
    )


def one_latency_run(bench: Bench, i: int) -> tuple[float, float]:
    ns = bench.namespace(f"latency-{i}")
    failed = Stamps(
        bench.core.list_namespaced_pod,
        lambda p: p.metadata.name if p.status.phase == "Failed" else None,
        namespace=ns,
    )
    events = Stamps(
        bench.core.list_namespaced_event,
        lambda e: e.involved_object.name if e.reason == "FailureDiagnosed" else None,
        namespace=ns,
    )
    jobs = Stamps(
        bench.batch.list_namespaced_job,
        lambda j: (
            j.metadata.name
            if any(c.type == "Failed" and c.status == "True" for c in j.status.conditions or [])
            else None
        ),
        namespace=ns,
    )
    bench.job(ns, "fatal", steps=100, args=["--fault", "shape@5"])
    bench.batch.create_namespaced_job(
        ns,
        {
            "metadata": {"name": "plain"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "local",
                                "command": ["sh", "-c", "sleep 8; exit 3"],
                            }
                        ],
                    }
                },
            },
        },
    )
    until(lambda: "fatal" in events.times and "plain" in jobs.times, 180)
    first_pod = min(t for n, t in failed.times.items() if n.startswith("fatal-"))
    plain_pod = min(t for n, t in failed.times.items() if n.startswith("plain-"))
    for stamps in (failed, events, jobs):
        stamps.stop()
    return events.times["fatal"] - first_pod, jobs.times["plain"] - plain_pod


def node_loss(bench: Bench, repeats: int, errors: list[str]) -> dict[str, Any]:
    runs = attempts(lambda i: one_node_loss_run(bench, i), repeats, errors)
    return summary(
        "node NotReady -> replacement slice Running (s)",
        [r[0] for r in runs],
        "node NotReady -> Deployment replacement Running (s)",
        [r[1] for r in runs],
    )


def one_node_loss_run(bench: Bench, i: int) -> tuple[float, float]:
    ns = bench.namespace(f"nodeloss-{i}")
    bench.heal_all()
    bench.job(ns, "train", steps=100000, args=[])
    until(
        lambda: (
            bench.status(ns, "train").get("phase") == "Running"
            and (bench.status(ns, "train").get("progress") or {}).get("step", 0) > 5
        ),
        180,
    )
    pods = bench.core.list_namespaced_pod(ns, label_selector=f"{labels.JOB}=train").items
    node = next(p.spec.node_name for p in pods if p.metadata.labels[labels.WORKER] == "1")
    bench.apps.create_namespaced_deployment(
        ns,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "nodeName": None,
                        "affinity": {
                            "nodeAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 100,
                                        "preference": {
                                            "matchExpressions": [
                                                {
                                                    "key": "kubernetes.io/hostname",
                                                    "operator": "In",
                                                    "values": [node],
                                                }
                                            ]
                                        },
                                    }
                                ]
                            }
                        },
                        "tolerations": [{"key": labels.TPU_RESOURCE, "operator": "Exists"}],
                        "containers": [
                            {"name": "main", "image": "local", "command": ["sleep", "100000"]}
                        ],
                    },
                },
            },
        },
    )
    until(
        lambda: any(
            p.status.phase == "Running" and p.spec.node_name == node
            for p in bench.core.list_namespaced_pod(ns, label_selector="app=web").items
        ),
        60,
    )
    faults.set_node_fault(bench.state_dir, node, down=True)
    not_ready = until(
        lambda: (
            next(
                c.status for c in bench.core.read_node(node).status.conditions if c.type == "Ready"
            )
            != "True"
            and time.monotonic()
        ),
        120,
    )

    def replaced(selector: str, attempt: str | None) -> bool:
        live = [
            p
            for p in bench.core.list_namespaced_pod(ns, label_selector=selector).items
            if p.spec.node_name != node
            and p.status.phase == "Running"
            and p.metadata.deletion_timestamp is None
            and (attempt is None or p.metadata.labels.get(labels.ATTEMPT) == attempt)
        ]
        return len(live) == (2 if attempt else 1)

    done: dict[str, float] = {}
    deadline = time.monotonic() + 180
    while len(done) < 2 and time.monotonic() < deadline:
        if "ours" not in done and replaced(f"{labels.JOB}=train", "2"):
            done["ours"] = time.monotonic()
        if "baseline" not in done and replaced("app=web", None):
            done["baseline"] = time.monotonic()
        time.sleep(0.1)
    if len(done) < 2:
        status = bench.status(ns, "train")
        raise TimeoutError(
            f"replacement not seen ({sorted(done)}); job phase "
            f"{status.get('phase')} attempt {status.get('attempt')}: "
            f"{(status.get('lastFailure') or {}).get('summary')}"
        )
    bench.core.delete_namespace(ns)
    bench.heal_all()
    return done["ours"] - not_ready, done["baseline"] - not_ready


def goodput(bench: Bench, minutes: float, fault_every: float) -> dict[str, Any]:
    results = {
        label: one_goodput_run(bench, label, minutes, fault_every if faulty else None)
        for label, faulty in (("baseline", False), ("ours", True))
    }
    ratio = (results["ours"]["goodput"] or 0) / (results["baseline"]["goodput"] or 1)
    return {
        "minutes": minutes,
        "fault_every_seconds": fault_every,
        **results,
        "goodput_ratio_vs_no_faults": round(ratio, 3),
    }


def one_goodput_run(
    bench: Bench, label: str, minutes: float, fault_every: float | None
) -> dict[str, Any]:
    with_faults = fault_every is not None
    ns = bench.namespace(f"goodput-{label}")
    bench.job(ns, "run", steps=1000000, args=[])
    until(lambda: bench.status(ns, "run").get("phase") == "Running", 180)
    start = time.monotonic()
    next_fault, kind = start + (fault_every or 0), 0
    while time.monotonic() - start < minutes * 60:
        if with_faults and time.monotonic() >= next_fault:
            status = bench.status(ns, "run")
            attempt = status["attempt"]
            pods = bench.core.list_namespaced_pod(
                ns, label_selector=f"{labels.JOB}=run,{labels.ATTEMPT}={attempt}"
            ).items
            target = next((p for p in pods if p.status.phase == "Running"), None)
            if target is not None:
                if kind % 2 == 0:
                    faults.kill_pod(
                        bench.state_dir, faults.find_pod(bench.state_dir, target.metadata.name, ns)
                    )
                else:
                    faults.set_node_fault(bench.state_dir, target.spec.node_name, down=True)
                    threading.Timer(
                        30,
                        faults.set_node_fault,
                        (bench.state_dir, target.spec.node_name),
                        {"down": False},
                    ).start()
                kind += 1
            next_fault += fault_every or 0
        time.sleep(1)
    status = bench.status(ns, "run")
    bench.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "run")
    bench.heal_all()
    return {
        "goodput": status.get("goodput"),
        "restarts": status.get("restarts"),
        "step": (status.get("progress") or {}).get("step"),
    }


def summary(name: str, ours: list[float], base_name: str, base: list[float]) -> dict[str, Any]:
    if not ours or not base:
        return {"metric": name, "runs": ours, "baseline_metric": base_name, "baseline_runs": base}
    return {
        "metric": name,
        "runs": [round(x, 3) for x in ours],
        "median": round(statistics.median(ours), 3),
        "baseline_metric": base_name,
        "baseline_runs": [round(x, 3) for x in base],
        "baseline_median": round(statistics.median(base), 3),
        "ratio_median": round(statistics.median(ours) / statistics.median(base), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fault-every", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "recovery.json")
    args = parser.parse_args()
    bench = Bench(Path(tempfile.mkdtemp(prefix="tpujob-bench-cluster-")))
    errors: list[str] = []
    report: dict[str, Any] = {"machine_cores": os.cpu_count(), "errors": errors}
    try:
        report["diagnosis_latency"] = diagnosis_latency(bench, args.repeats, errors)
        report["node_loss"] = node_loss(bench, args.repeats, errors)
        try:
            report["goodput"] = goodput(bench, args.minutes, args.fault_every)
        except Exception as err:
            errors.append(f"goodput: {err!r}")
    finally:
        bench.close()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
