"""One arm's fresh cluster: the local control plane with no TPU pools of its own, kwok faking
GKE TPU pools, and the arm's controller (tpujob's operator, JobSet, or none: the Job controller
is built in), each controller with its own counted API identity.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_recovery import _exists, until
from kubernetes import client, config

from scale import identity, measure, nodes, peers, workloads
from tpujob.local import controlplane
from tpujob.local.binaries import binary_dir

NAMESPACE = "bench"
COMPONENTS = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")
# Which process is "the controller" of each arm. The Job arm's controller is KCM's Job
# controller, so its process figures are all of KCM's.
CONTROLLER = {
    "tpujob": "tpujob-operator",
    "jobset": "jobset",
    "job": "kube-controller-manager",
    "tpujob-kueue": "tpujob-operator",
    "jobset-kueue": "jobset",
}
# Whose requests count as the arm's: JobSet's pods are created by the Job controller; a queued
# arm's also Kueue's.
REQUESTERS = {
    "tpujob": ("tpujob",),
    "jobset": ("jobset", "job-controller"),
    "job": ("job-controller",),
    "tpujob-kueue": ("tpujob", "kueue"),
    "jobset-kueue": ("jobset", "job-controller", "kueue"),
}


@dataclass(frozen=True)
class Settings:
    """Cluster knobs recorded with every result."""

    node_monitor_grace_seconds: int = 50
    kwok_lease_seconds: int = 40
    accelerator: str = "tpu-v5-lite-podslice"
    topology: str = "4x4"


@dataclass
class Snapshot:
    at: float
    procs: dict[str, measure.Proc | None]
    requests: measure.Requests


class ArmCluster:
    """Start with `up()`, always end with `close()`."""

    def __init__(self, arm: str, state_dir: Path, pools: int, settings: Settings) -> None:
        self.arm, self.state_dir, self.pools, self.settings = arm, state_dir, pools, settings
        self.kubeconfig = state_dir / "kubeconfig"
        self.kubectl = str(binary_dir() / "kubectl")
        self.procs: dict[str, peers.Process | peers.Adopted] = {}
        self.pids: dict[str, int] = {}
        self.api: Any = None

    # --- lifecycle -------------------------------------------------------------------------
    def up(self, bin_dir: Path) -> None:
        controlplane.NODE_MONITOR_GRACE_SECONDS = self.settings.node_monitor_grace_seconds
        state = controlplane.up(
            self.state_dir, controlplane.PoolOptions(pools=0, spare_nodes=1), out=sys.stderr
        )
        self.pids = {c.name: c.pid for c in state.components if c.name in COMPONENTS}
        cfg = client.Configuration()
        config.load_kube_config(str(self.kubeconfig), client_configuration=cfg)
        cfg.connection_pool_maxsize = 32
        self.api = client.ApiClient(cfg)
        logs = self.state_dir / "logs"
        self.apply(
            identity.objects(
                {
                    "tpujob": identity.user_subject("tpujob"),
                    "jobset": identity.user_subject("jobset"),
                    "kueue": identity.user_subject("kueue"),
                    "job-controller": identity.job_controller_subject(),
                }
            )
        )
        self.procs["kwok"] = peers.kwok(
            bin_dir, self.kubeconfig, logs, self.settings.kwok_lease_seconds
        )
        self.pids["kwok"] = self.procs["kwok"].pid
        self.add_nodes(nodes.pools(self.pools, self.settings.accelerator, self.settings.topology))
        self.wait_nodes_ready(self.pools * nodes.slice_shape(self.settings.topology)[0])
        core = client.CoreV1Api(self.api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        until(
            lambda: _exists(lambda: core.read_namespaced_service_account("default", NAMESPACE)), 60
        )
        server = f"https://127.0.0.1:{state.apiserver_port}"
        kind = workloads.base(self.arm)
        if kind == "tpujob":
            self.kubectl_run("apply", "--server-side", "-f", str(peers.ROOT / "crds"))
            self.wait_crd("tputrainingjobs.tpujob.dev")
        elif kind == "jobset":
            self.kubectl_run(
                "apply", "--server-side", "--force-conflicts", "-f", str(peers.jobset_crd())
            )
            self.wait_crd("jobsets.jobset.x-k8s.io")
        if self.arm in workloads.QUEUED:
            self.start_kueue(kind, server, logs)
        if kind == "tpujob":
            kc = identity.kubeconfig(self.state_dir, "tpujob", server)
            queued = self.arm in workloads.QUEUED
            self.procs["tpujob-operator"] = peers.operator(kc, logs, kueue=queued)
            time.sleep(3)
        elif kind == "jobset":
            self.kubectl_run(
                "apply", "--server-side", "--force-conflicts", "-f", str(peers.jobset_crd())
            )
            self.wait_crd("jobsets.jobset.x-k8s.io")
            kc = identity.kubeconfig(self.state_dir, "jobset", server)
            proc, hooks = peers.jobset(bin_dir, self.state_dir, kc, logs)
            self.procs["jobset"] = proc
            self.apply(hooks)
        for name, proc in self.procs.items():
            self.pids[name] = proc.pid

    def start_kueue(self, kind: str, server: str, logs: Path) -> None:
        """Kueue with a ClusterQueue whose quota is every pool's chips, and its LocalQueue."""
        from tpujob.local import kueue

        for crd in kueue.crd_files():
            self.kubectl_run("apply", "--server-side", "--force-conflicts", "-f", str(crd))
        self.wait_crd("workloads.kueue.x-k8s.io")
        self.wait_crd("clusterqueues.kueue.x-k8s.io")
        kc = identity.kubeconfig(self.state_dir, "kueue", server)
        work = self.state_dir / "kueue"
        work.mkdir(exist_ok=True)
        jobsets = kind == "jobset"
        running = kueue.start(
            work,
            kc,
            self.state_dir / "kueue-ca",
            frameworks=("jobset.x-k8s.io/jobset",) if jobsets else ("batch/job",),
            webhook_groups=frozenset(
                {"kueue.x-k8s.io", "jobset.x-k8s.io"} if jobsets else {"kueue.x-k8s.io"}
            ),
            qps=peers.KUEUE_QPS,
        )
        self.procs["kueue"] = peers.Adopted("kueue", running)
        self.apply(running.webhooks)
        hosts, chips = nodes.slice_shape(self.settings.topology)
        self.apply(
            peers.kueue_queues(
                NAMESPACE,
                workloads.QUEUE,
                self.settings.accelerator,
                self.settings.topology,
                quota=self.pools * hosts * chips,
            )
        )

    def close(self) -> None:
        for proc in reversed(list(self.procs.values())):
            proc.stop()
        controlplane.down(self.state_dir, purge=True)

    # --- helpers ---------------------------------------------------------------------------
    def kubectl_run(self, *args: str, stdin: str | None = None) -> str:
        return subprocess.run(
            [self.kubectl, "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl_run(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        )

    def wait_crd(self, name: str) -> None:
        ext = client.ApiextensionsV1Api(self.api)

        def established() -> bool:
            crd = ext.read_custom_resource_definition(name)
            return any(
                c.type == "Established" and c.status == "True"
                for c in (crd.status.conditions or [])
            )

        until(established, 60)

    def add_nodes(self, items: list[dict[str, Any]]) -> None:
        core = client.CoreV1Api(self.api)
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(core.create_node, items))

    def wait_nodes_ready(self, count: int, timeout: float = 300) -> None:
        core = client.CoreV1Api(self.api)

        def ready() -> bool:
            items = core.list_node(label_selector=f"{nodes.MANAGED}=fake", _preload_content=False)
            body = json.loads(items.data)
            n = sum(
                1
                for it in body["items"]
                for c in it["status"].get("conditions") or []
                if c["type"] == "Ready" and c["status"] == "True"
            )
            return n >= count

        until(ready, timeout, interval=3.0)

    def snapshot(self) -> Snapshot:
        text = self.kubectl_run("get", "--raw", "/metrics")
        return Snapshot(
            time.monotonic(),
            {k: measure.proc(v) for k, v in self.pids.items()},
            measure.Requests.parse(text),
        )


def cost(arm: str, before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """What the window between two snapshots cost: CPU, peak memory, requests by verb."""
    procs: dict[str, Any] = {}
    for name, end in after.procs.items():
        start = before.procs.get(name)
        if end is None:
            continue
        procs[name] = {
            "cpu_seconds": round(end.cpu_seconds - (start.cpu_seconds if start else 0.0), 2),
            "peak_rss_mib": end.peak_rss_mib,
            "rss_mib": end.rss_mib,
        }
    requests = after.requests.minus(before.requests)
    controller = procs.get(CONTROLLER[arm], {})
    arm_requests = sum(requests.get(r, {}).get("total", 0) for r in REQUESTERS[arm])
    return {
        "seconds": round(after.at - before.at, 1),
        "processes": procs,
        "requests": requests,
        "controller": CONTROLLER[arm],
        "controller_cpu_seconds": controller.get("cpu_seconds"),
        "controller_peak_rss_mib": controller.get("peak_rss_mib"),
        # A queued arm's Kueue, counted beside its controller (None for the others).
        "kueue_cpu_seconds": procs.get("kueue", {}).get("cpu_seconds"),
        "kueue_peak_rss_mib": procs.get("kueue", {}).get("peak_rss_mib"),
        "arm_requests": arm_requests,
        "arm_requesters": list(REQUESTERS[arm]),
    }
