"""Kueue beside the local cluster, for the tests and benchmarks of a source checkout.

Kueue is built from the Go module pinned in tools/kueue/go.mod (`tools/build-go-tool.sh`,
once per machine) and runs as a process, out of cluster, as the benchmarks run JobSet: its
webhooks are served on 127.0.0.1 with a certificate of the local cluster's CA and registered by
URL (no Service, no certificate rotation, no leader election). Its CRDs and webhook list come
from the module's own `config/`. Only the webhooks of Kueue's own objects are registered: no
job framework is enabled, and `TPUTrainingJob` is an external framework, integrated by the
operator (`tpujob.plan.queueing`), so Kueue never sees the trainer pods.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from tpujob.api import GROUP, KIND, VERSION
from tpujob.local import pki
from tpujob.local.processes import ComponentError, child_pids

ROOT = Path(__file__).resolve().parents[3]
TOOLS = ROOT / "tools"
MODULE = "sigs.k8s.io/kueue"
EXTERNAL_FRAMEWORK = f"{KIND}.{VERSION}.{GROUP}"
READY_SECONDS = 120.0
# Where Kueue reads its metrics server's certificate when it manages no certificates itself.
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
# Off: MultiKueue and the visibility API need objects in Kueue's own namespace, or a port of
# their own, that an out-of-cluster Kueue beside parallel test clusters does not have. On: the
# priority boost the operator publishes for checkpoint-aware preemption (alpha in v0.19).
FEATURE_GATES = {"MultiKueue": False, "VisibilityOnDemand": False, "PriorityBoost": True}


def _go(*args: str) -> str:
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOWORK": "off", "GOFLAGS": "-mod=mod"}
    proc = subprocess.run(
        ["go", *args], cwd=TOOLS / "kueue", capture_output=True, text=True, env=env, check=False
    )
    if proc.returncode != 0:
        raise ComponentError(f"go {' '.join(args)} failed: {proc.stderr.strip()[-400:]}")
    return proc.stdout.strip()


def binary() -> Path:
    """The kueue binary, built from the pinned module if this machine has none yet."""
    script = TOOLS / "build-go-tool.sh"
    proc = subprocess.run(
        [str(script), "kueue", MODULE, f"{MODULE}/cmd/kueue", "kueue"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ComponentError(f"building kueue failed: {proc.stderr.strip()[-400:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def module_dir() -> Path:
    """The pinned Kueue module's source (its CRDs and webhook list are read from there),
    downloaded into Go's module cache first on a machine that has not built Kueue yet."""
    found = json.loads(_go("mod", "download", "-json", MODULE))
    if not found.get("Dir"):
        raise ComponentError(f"go mod download {MODULE} gave no folder: {found.get('Error')}")
    return Path(found["Dir"])


def crd_files() -> list[Path]:
    found = sorted((module_dir() / "config" / "components" / "crd" / "bases").glob("*.yaml"))
    if not found:
        raise ComponentError(f"{MODULE} has no CRDs under config/components/crd/bases")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def configuration(
    work: Path,
    ports: tuple[int, int, int],
    *,
    pods_ready_seconds: int,
    frameworks: tuple[str, ...] = ("batch/job",),
    qps: int | None = None,
) -> str:
    """Kueue's configuration: out of cluster, TPUTrainingJob as an external framework."""
    webhook, metrics, health = ports
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook, "certDir": str(work / "certs")},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "waitForPodsReady": {"timeout": f"{pods_ready_seconds}s", "blockAdmission": False},
        # Kueue enables batch/job when given no framework; unless asked for, the frameworks'
        # webhooks are not registered here, and it acts only on objects that name a queue.
        "integrations": {
            "frameworks": list(frameworks),
            "externalFrameworks": [EXTERNAL_FRAMEWORK],
        },
        "featureGates": FEATURE_GATES,
    }
    if qps is not None:
        config["clientConnection"] = {"qps": qps, "burst": qps}
    return yaml.safe_dump(config)


def webhook_configurations(
    url: str, ca_bundle: bytes, groups: frozenset[str] = frozenset({"kueue.x-k8s.io"})
) -> list[dict[str, Any]]:
    """Kueue's webhooks for the objects of `groups` (its own, by default), by URL (the module
    lists them for a Service)."""
    source = module_dir() / "config" / "components" / "webhook" / "manifests.yaml"
    bundle = base64.b64encode(ca_bundle).decode()
    configurations = []
    for doc in yaml.safe_load_all(source.read_text()):
        if not doc or not doc.get("kind", "").endswith("WebhookConfiguration"):
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            hooked = {g for rule in hook.get("rules") or [] for g in rule.get("apiGroups") or []}
            if not hooked or not hooked <= groups:
                continue  # a job framework's that is not asked for
            path = hook["clientConfig"]["service"]["path"]
            by_url = {**hook, "clientConfig": {"url": f"{url}{path}", "caBundle": bundle}}
            by_url.pop("namespaceSelector", None)
            hooks.append(by_url)
        configurations.append(
            {
                "apiVersion": doc["apiVersion"],
                "kind": doc["kind"],
                "metadata": {"name": f"tpujob-local-{doc['metadata']['name']}"},
                "webhooks": hooks,
            }
        )
    return configurations


def _with_metrics_certs(certs: Path) -> list[str]:
    """A bubblewrap prefix that shows `certs` at METRICS_CERTS and the rest of the machine as
    it is: without cluster-managed certificates Kueue reads its metrics server's certificate
    from that fixed path, which this process does not write on the host. /etc becomes a
    tmpfs holding the host's entries, bound one by one, plus that folder."""
    args = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/etc"]
    for entry in sorted(os.scandir("/etc"), key=lambda e: e.name):
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), entry.path]
        else:
            args += ["--dev-bind", entry.path, entry.path]
    return [*args, "--dir", str(METRICS_CERTS.parent), "--ro-bind", str(certs), str(METRICS_CERTS)]


@dataclass
class Kueue:
    """A running Kueue; `webhooks` are to be applied once it is ready."""

    popen: subprocess.Popen[bytes]
    log_path: Path
    webhooks: list[dict[str, Any]]

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def pid(self) -> int:
        """Kueue's own process: the child of the bubblewrap that holds its mounts (whose CPU
        and memory are what a measurement wants), or that process while it has none."""
        root = self.popen.pid
        children = child_pids(root)
        return children[0] if children else root

    def stop(self) -> None:
        if not self.alive():
            return
        os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def start(
    work: Path,
    kubeconfig: Path,
    ca_dir: Path,
    *,
    pods_ready_seconds: int = 300,
    frameworks: tuple[str, ...] = ("batch/job",),
    webhook_groups: frozenset[str] = frozenset({"kueue.x-k8s.io"}),
    qps: int | None = None,
) -> Kueue:
    """Start Kueue against the cluster of `kubeconfig` (its CRDs applied already); returns
    once it answers its readiness probe. `ca_dir` holds the CA its webhook certificate is
    issued by (the cluster's, or one of the caller's); `frameworks` are Kueue's job
    integrations, and `webhook_groups` the API groups whose webhooks are to be registered."""
    certs = work / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    ca = pki.CertificateAuthority(ca_dir)
    crt, key = ca.issue(
        "kueue-webhook", "kueue-webhook", dns_names=("localhost",), ips=("127.0.0.1",), server=True
    )
    (certs / "tls.crt").write_bytes(crt.read_bytes())
    (certs / "tls.key").write_bytes(key.read_bytes())
    ports = (_free_port(), _free_port(), _free_port())
    (work / "config.yaml").write_text(
        configuration(
            work, ports, pods_ready_seconds=pods_ready_seconds, frameworks=frameworks, qps=qps
        )
    )
    log_path = work / "kueue.log"
    log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 - the child owns it
    popen = subprocess.Popen(
        [
            *_with_metrics_certs(certs),
            str(binary()),
            "--config",
            str(work / "config.yaml"),
            "--zap-log-level=2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        start_new_session=True,
    )
    kueue = Kueue(
        popen,
        log_path,
        webhook_configurations(f"https://127.0.0.1:{ports[0]}", ca.cert_path.read_bytes()),
    )
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[2]}/readyz", timeout=2):
                return kueue
        except OSError:
            if not kueue.alive():
                raise ComponentError(f"kueue exited:\n{kueue.log_tail()}") from None
            time.sleep(0.5)
    kueue.stop()
    raise ComponentError(f"kueue not ready in {READY_SECONDS:.0f} s:\n{kueue.log_tail()}")
