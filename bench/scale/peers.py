"""The processes an arm runs beside the local control plane: kwok, the JobSet controller, tpujob.

kwok and JobSet come from `tools/build-bench-peers.sh` (versions pinned in tools/kwok/go.mod and
tools/jobset/go.mod). JobSet runs out of cluster with its webhooks served on 127.0.0.1 and
registered by URL (no cert rotation, no leader election, no Service); its CRD comes from the
module the build downloaded. The operator runs as a process from this repository.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import yaml

from tpujob.local import pki

ROOT = Path(__file__).resolve().parents[2]
STAGES = Path(__file__).resolve().parent / "tpu-stages.yaml"
BUILD = ROOT / "tools" / "build-bench-peers.sh"
JOBSET_VERSION = next(
    line.split()[2]
    for line in (ROOT / "tools" / "jobset" / "go.mod").read_text().splitlines()
    if line.startswith("require sigs.k8s.io/jobset")
)
OPERATOR_ARGS = ("--metrics-port", "0", "--liveness-port", "0")
JOBSET_QPS = 500  # v0.10.1's and v0.12.0's defaults, written out so the result records them
KUEUE_QPS = 300  # v0.19.2's default client rate, written out likewise


class Adopted:
    """A process started elsewhere (Kueue, by `tpujob.local.kueue`), stopped like ours."""

    def __init__(self, name: str, running: Any) -> None:
        self.name, self.running = name, running
        self.log_path = running.log_path

    @property
    def pid(self) -> int:
        return int(self.running.pid)

    def alive(self) -> bool:
        return bool(self.running.alive())

    def stop(self) -> None:
        self.running.stop()


def kueue_queues(
    namespace: str, queue: str, accelerator: str, topology: str, *, quota: int
) -> list[dict[str, Any]]:
    """The GKE recipe's Kueue objects: a flavor per TPU shape, a ClusterQueue with `quota`
    chips of it, the namespace's LocalQueue."""
    api = "kueue.x-k8s.io/v1beta2"
    flavor = f"{accelerator}-{topology}"
    return [
        {
            "apiVersion": api,
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor},
            "spec": {
                "nodeLabels": {
                    "cloud.google.com/gke-tpu-accelerator": accelerator,
                    "cloud.google.com/gke-tpu-topology": topology,
                }
            },
        },
        {
            "apiVersion": api,
            "kind": "ClusterQueue",
            "metadata": {"name": "bench"},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["google.com/tpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [{"name": "google.com/tpu", "nominalQuota": quota}],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "LocalQueue",
            "metadata": {"name": queue, "namespace": namespace},
            "spec": {"clusterQueue": "bench"},
        },
    ]


def peers_dir() -> Path:
    """Where the build keeps kwok and jobset (building them first if missing)."""
    out = subprocess.run([str(BUILD)], check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child in its own process group, its output in a log file."""

    def __init__(
        self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.popen = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if not self.alive():
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()


def kwok(bin_dir: Path, kubeconfig: Path, log_dir: Path, lease_seconds: int) -> Process:
    return Process(
        "kwok",
        [
            str(bin_dir / "kwok"),
            "--kubeconfig",
            str(kubeconfig),
            "--config",
            str(STAGES),
            "--node-lease-duration-seconds",
            str(lease_seconds),
            "--server-address",
            f"127.0.0.1:{free_port()}",
        ],
        log_dir,
    )


def operator(kubeconfig: Path, log_dir: Path, *, kueue: bool = False) -> Process:
    return Process(
        "tpujob-operator",
        [
            sys.executable,
            "-m",
            "tpujob.cli",
            "operator",
            "--kubeconfig",
            str(kubeconfig),
            *OPERATOR_ARGS,
            *(("--kueue",) if kueue else ()),
        ],
        log_dir,
        env={"PYTHONPATH": str(ROOT / "operator"), "PYTHONUNBUFFERED": "1"},
    )


def jobset_crd() -> Path:
    mod = subprocess.run(
        ["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return (
        Path(mod)
        / f"sigs.k8s.io/jobset@{JOBSET_VERSION}"
        / "config/components/crd/bases"
        / "jobset.x-k8s.io_jobsets.yaml"
    )


def jobset(
    bin_dir: Path,
    state_dir: Path,
    kubeconfig: Path,
    log_dir: Path,
    *,
    feature_gates: Mapping[str, bool] | None = None,
) -> tuple[Process, list[dict[str, Any]]]:
    """Start JobSet (its alpha `feature_gates` on, from its configuration file: v0.12 has no
    flag for them); returns it and the webhook registrations to apply once it is ready."""
    work = state_dir / "jobset"
    certs = work / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca = pki.CertificateAuthority(state_dir / "pki")
    crt, key = ca.issue(
        "jobset-webhook",
        "jobset-webhook",
        dns_names=("localhost",),
        ips=("127.0.0.1",),
        server=True,
    )
    (certs / "tls.crt").write_bytes(crt.read_bytes())
    (certs / "tls.key").write_bytes(key.read_bytes())
    webhook, metrics, health = free_port(), free_port(), free_port()
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(certs)},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}", "certDir": str(certs)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "clientConnection": {"qps": JOBSET_QPS, "burst": JOBSET_QPS},
    }
    if feature_gates:
        config["featureGates"] = dict(feature_gates)
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    proc = Process(
        "jobset",
        [
            str(bin_dir / "jobset"),
            "--config",
            str(work / "config.yaml"),
            "--kubeconfig",
            str(kubeconfig),
            "--zap-log-level=info",
        ],
        log_dir,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{health}/readyz", timeout=2)
            break
        except OSError:
            if not proc.alive():
                raise RuntimeError(f"jobset exited; see {proc.log_path}") from None
            time.sleep(0.5)
    else:
        raise RuntimeError(f"jobset not ready in 90 s; see {proc.log_path}")
    return proc, webhooks(f"https://127.0.0.1:{webhook}", ca.cert_path)


def webhooks(url: str, ca_path: Path) -> list[dict[str, Any]]:
    """JobSet's four webhooks by URL; the pod ones only for JobSet pods (its kustomize patch)."""
    import base64

    bundle = base64.b64encode(ca_path.read_bytes()).decode()
    only_jobset_pods = {
        "matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]
    }

    def hook(
        name: str,
        path: str,
        *,
        group: str,
        resource: str,
        ops: list[str],
        selector: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        h: dict[str, Any] = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "clientConfig": {"url": f"{url}/{path}", "caBundle": bundle},
            "rules": [
                {
                    "apiGroups": [group],
                    "apiVersions": ["v1alpha2" if group else "v1"],
                    "operations": ops,
                    "resources": [resource],
                }
            ],
        }
        if selector:
            h["objectSelector"] = selector
        return h

    group = "jobset.x-k8s.io"
    jobsets: dict[str, Any] = {"group": group, "resource": "jobsets"}
    pods: dict[str, Any] = {"group": "", "resource": "pods", "selector": only_jobset_pods}
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "jobset-mutating-webhook-configuration"},
            "webhooks": [
                hook(
                    "mjobset.kb.io",
                    "mutate-jobset-x-k8s-io-v1alpha2-jobset",
                    ops=["CREATE"],
                    **jobsets,
                ),
                hook("mpod.kb.io", "mutate--v1-pod", ops=["CREATE"], **pods),
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "jobset-validating-webhook-configuration"},
            "webhooks": [
                hook(
                    "vjobset.kb.io",
                    "validate-jobset-x-k8s-io-v1alpha2-jobset",
                    ops=["CREATE", "UPDATE"],
                    **jobsets,
                ),
                hook("vpod.kb.io", "validate--v1-pod", ops=["CREATE"], **pods),
            ],
        },
    ]
