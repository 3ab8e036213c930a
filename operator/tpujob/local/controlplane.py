"""`tpujob local up|down|status`: the control plane of the local cluster as local processes.

etcd, kube-apiserver, kube-scheduler, kube-controller-manager and the node agent run as
detached processes on free 127.0.0.1 ports; everything about a cluster lives in its state
directory (certificates, etcd data, logs, `state.json`, the admin `kubeconfig`). Failure
detection is tuned for tests: a node that stops renewing its Lease is NotReady within seconds,
and its pods are evicted seconds later.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tpujob.local import network, pki, processes
from tpujob.local.binaries import locate_binaries
from tpujob.local.processes import ComponentError, Running

NODE_MONITOR_GRACE_SECONDS = 6
TOLERATION_SECONDS = 5
SERVICE_CIDR = "10.0.0.0/24"
COMPONENT_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "agent")


@dataclass(frozen=True)
class PoolOptions:
    """The node pools the agent fakes: `pools` TPU slices plus `spare_nodes` CPU nodes."""

    pools: int = 3
    accelerator: str = "tpu-v5-lite-podslice"
    topology: str = "4x4"
    spare_nodes: int = 1


@dataclass
class ClusterState:
    """What `up` started, persisted as DIR/state.json."""

    state_dir: str
    apiserver_port: int
    etcd_port: int
    pools: PoolOptions
    network: network.ClusterNetwork
    components: list[Running] = field(default_factory=list)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def save(self) -> None:
        data = {
            "state_dir": self.state_dir,
            "apiserver_port": self.apiserver_port,
            "etcd_port": self.etcd_port,
            "pools": asdict(self.pools),
            "network": asdict(self.network),
            "components": [c.to_json() for c in self.components],
        }
        path = Path(self.state_dir) / "state.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(path)

    @staticmethod
    def load(state_dir: Path) -> ClusterState | None:
        path = state_dir / "state.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return ClusterState(
            state_dir=str(data["state_dir"]),
            apiserver_port=int(data["apiserver_port"]),
            etcd_port=int(data["etcd_port"]),
            pools=PoolOptions(**data["pools"]),
            network=network.ClusterNetwork(**data["network"]),
            components=[Running.from_json(c) for c in data["components"]],
        )

    def alive_components(self) -> list[Running]:
        return [c for c in self.components if c.alive()]


def default_state_dir() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tpujob" / "local"


@contextlib.contextmanager
def locked(state_dir: Path) -> Iterator[None]:
    """Hold the state directory's lock, or fail at once if another command holds it."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as err:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise ComponentError(
                f"state dir {state_dir} is busy: tpujob local is already working on it ({holder})"
            ) from err
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tls_context(
    pki_dir: Path, *, client: pki.Identity | None = pki.ADMIN, verify: bool = True
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if client is not None:
        ctx.load_cert_chain(pki_dir / f"{client.stem}.crt", pki_dir / f"{client.stem}.key")
    return ctx


def _healthy(url: str, ctx: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _wait_healthy(comp: Running, url: str, ctx: ssl.SSLContext | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not comp.alive():
            raise ComponentError(
                f"{comp.name} died during start-up: {processes.last_line(comp.log)} "
                f"(log: {comp.log})"
            )
        if _healthy(url, ctx):
            return
        time.sleep(0.3)
    raise ComponentError(
        f"{comp.name} not healthy after {timeout:.0f}s: "
        f"{processes.last_line(comp.log)} (log: {comp.log})"
    )


def _take_port(requested: int | None, what: str) -> int:
    if requested is None:
        return processes.free_port()
    if processes.port_in_use(requested):
        raise ComponentError(f"port {requested} for {what} is already in use on 127.0.0.1")
    return requested


def up(
    state_dir: Path,
    pools: PoolOptions,
    *,
    apiserver_port: int | None = None,
    out: object = sys.stdout,
) -> ClusterState:
    """Start the cluster in `state_dir`; a running cluster there is left as it is."""
    state_dir = state_dir.resolve()
    with locked(state_dir):
        existing = ClusterState.load(state_dir)
        if existing is not None and existing.alive_components():
            dead = [c.name for c in existing.components if not c.alive()]
            note = f"; not running: {', '.join(dead)} (run down, then up)" if dead else ""
            print(f"cluster already running in {state_dir} at {existing.server}{note}", file=out)  # type: ignore[call-overload]
            return existing
        bins = locate_binaries()
        state = ClusterState(
            state_dir=str(state_dir),
            apiserver_port=_take_port(apiserver_port, "kube-apiserver"),
            etcd_port=processes.free_port(),
            pools=pools,
            network=network.choose_network(str(state_dir)),
        )
        try:
            _start_all(state, bins)
        except BaseException:
            for comp in reversed(state.components):
                processes.stop(comp, grace=3)
            network.cleanup_cluster(state.network)
            state.components = []
            state.save()
            raise
        return state


def _start_all(state: ClusterState, bins: dict[str, Path]) -> None:
    root = Path(state.state_dir)
    logs, pki_dir = root / "logs", root / "pki"
    ca = pki.CertificateAuthority(pki_dir)
    serving_ips = ("127.0.0.1", "10.0.0.1", state.network.gateway)
    serving_names = (
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    tls_cert, tls_key = ca.issue(
        "apiserver", "kube-apiserver", dns_names=serving_names, ips=serving_ips, server=True
    )
    sa_key, sa_pub = pki.ensure_service_account_keys(pki_dir)
    kubelet_cert, kubelet_key = ca.issue_client(pki.APISERVER_KUBELET_CLIENT)
    kubeconfigs = {}
    for ident in (pki.ADMIN, pki.SCHEDULER, pki.CONTROLLER_MANAGER):
        cert, key = ca.issue_client(ident)
        name = "kubeconfig" if ident is pki.ADMIN else f"{ident.stem}.kubeconfig"
        kubeconfigs[ident.stem] = pki.write_kubeconfig(
            root / name,
            server=state.server,
            ca_path=ca.cert_path,
            cert_path=cert,
            key_path=key,
            user=ident.user,
        )
    network.create_bridge(state.network)

    def launch(name: str, argv: list[str]) -> Running:
        comp = processes.start(name, argv, logs)
        state.components.append(comp)
        state.save()
        return comp

    peer_port = processes.free_port()
    etcd = launch(
        "etcd",
        [
            str(bins["etcd"]),
            "--name",
            "default",
            "--data-dir",
            str(root / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{state.etcd_port}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{state.etcd_port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer_port}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
    )
    _wait_healthy(etcd, f"http://127.0.0.1:{state.etcd_port}/health", None, 30)
    apiserver = launch(
        "kube-apiserver",
        [
            str(bins["kube-apiserver"]),
            f"--etcd-servers=http://127.0.0.1:{state.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={state.apiserver_port}",
            f"--cert-dir={pki_dir}",
            f"--tls-cert-file={tls_cert}",
            f"--tls-private-key-file={tls_key}",
            f"--client-ca-file={ca.cert_path}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--authorization-mode=RBAC",
            "--endpoint-reconciler-type=none",
            f"--default-not-ready-toleration-seconds={TOLERATION_SECONDS}",
            f"--default-unreachable-toleration-seconds={TOLERATION_SECONDS}",
            f"--kubelet-client-certificate={kubelet_cert}",
            f"--kubelet-client-key={kubelet_key}",
            "--kubelet-preferred-address-types=InternalIP",
            "--profiling=false",
        ],
    )
    _wait_healthy(apiserver, f"{state.server}/readyz", _tls_context(pki_dir), 90)
    kcm = launch(
        "kube-controller-manager",
        [
            str(bins["kube-controller-manager"]),
            f"--kubeconfig={kubeconfigs['controller-manager']}",
            f"--authentication-kubeconfig={kubeconfigs['controller-manager']}",
            f"--authorization-kubeconfig={kubeconfigs['controller-manager']}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={processes.free_port()}",
            "--controllers=*",
            "--node-monitor-period=1s",
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE_SECONDS}s",
            "--node-eviction-rate=10",
            "--secondary-node-eviction-rate=10",
            f"--service-account-private-key-file={sa_key}",
            f"--root-ca-file={ca.cert_path}",
            "--use-service-account-credentials=true",
            "--terminated-pod-gc-threshold=500",
            "--concurrent-gc-syncs=5",
            "--profiling=false",
        ],
    )
    sched = launch(
        "kube-scheduler",
        [
            str(bins["kube-scheduler"]),
            f"--kubeconfig={kubeconfigs['scheduler']}",
            f"--authentication-kubeconfig={kubeconfigs['scheduler']}",
            f"--authorization-kubeconfig={kubeconfigs['scheduler']}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={processes.free_port()}",
            "--profiling=false",
        ],
    )
    for comp in (kcm, sched):
        port = _flag_value(comp, "--secure-port")
        _wait_healthy(
            comp,
            f"https://127.0.0.1:{port}/healthz",
            _tls_context(pki_dir, client=None, verify=False),
            60,
        )
    agent = launch("agent", [sys.executable, "-m", "tpujob.local.agent", "--state-dir", str(root)])
    _wait_agent_ready(agent, root)


def _flag_value(comp: Running, flag: str) -> str:
    return _argv_flag(_cmdline(comp), flag, comp.name)


def _cmdline(comp: Running) -> list[str]:
    return Path(f"/proc/{comp.pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


def _argv_flag(argv: list[str], flag: str, name: str) -> str:
    for arg in argv:
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise ComponentError(f"{name} has no {flag}")


# The control-plane components an outage can take away and bring back with the same flags.
RESTARTABLE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


@dataclass(frozen=True)
class Stopped:
    """A component `stop_component` stopped: what `start_component` needs to start it again."""

    name: str
    argv: tuple[str, ...]


def stop_component(state_dir: Path, name: str) -> Stopped:
    """Stop one running control-plane component, as an outage of it would (SIGTERM, then KILL).

    Everything else keeps running: clients of a stopped kube-apiserver see refused
    connections until `start_component` brings it back on the same port with the same flags.
    """
    if name not in RESTARTABLE:
        raise ComponentError(f"cannot stop {name}: only {', '.join(RESTARTABLE)}")
    state_dir = state_dir.resolve()
    with locked(state_dir):
        state = ClusterState.load(state_dir)
        comp = (
            next((c for c in state.components if c.name == name and c.alive()), None)
            if state is not None
            else None
        )
        if state is None or comp is None:
            raise ComponentError(f"{name} is not running in {state_dir}")
        argv = tuple(_cmdline(comp))
        processes.stop(comp, grace=10)
        state.components = [c for c in state.components if c is not comp]
        state.save()
    return Stopped(name, argv)


def start_component(state_dir: Path, stopped: Stopped, *, timeout: float = 90) -> Running:
    """Start a component `stop_component` stopped and wait until it answers its health check."""
    state_dir = state_dir.resolve()
    with locked(state_dir):
        state = ClusterState.load(state_dir)
        if state is None:
            raise ComponentError(f"no cluster in {state_dir}")
        pki_dir = state_dir / "pki"
        comp = processes.start(stopped.name, stopped.argv, state_dir / "logs")
        state.components.append(comp)
        state.save()
        if stopped.name == "etcd":
            _wait_healthy(comp, f"http://127.0.0.1:{state.etcd_port}/health", None, timeout)
        elif stopped.name == "kube-apiserver":
            _wait_healthy(comp, f"{state.server}/readyz", _tls_context(pki_dir), timeout)
        else:
            port = _argv_flag(list(stopped.argv), "--secure-port", stopped.name)
            _wait_healthy(
                comp,
                f"https://127.0.0.1:{port}/healthz",
                _tls_context(pki_dir, client=None, verify=False),
                timeout,
            )
    return comp


def _wait_agent_ready(agent: Running, root: Path, timeout: float = 60) -> None:
    ready = root / "agent" / "ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not agent.alive():
            raise ComponentError(
                f"node agent died during start-up: "
                f"{processes.last_line(agent.log)} (log: {agent.log})"
            )
        if ready.exists():
            return
        time.sleep(0.2)
    raise ComponentError(f"node agent registered no nodes in {timeout:.0f}s (log: {agent.log})")


def down(state_dir: Path, *, purge: bool = False) -> list[str]:
    """Stop everything `up` started; keep the state dir (etcd data, logs) unless `purge`."""
    state_dir = state_dir.resolve()
    with locked(state_dir):
        state = ClusterState.load(state_dir)
        if state is None:
            return []
        stopped = []
        # The agent stops pods first; the control plane goes last so nothing is left unowned.
        for name in reversed(COMPONENT_ORDER):
            for comp in state.components:
                if comp.name == name and comp.alive():
                    processes.stop(comp, grace=15 if name == "agent" else 10)
                    stopped.append(name)
        from tpujob.local.agent.runtime import kill_leftover_pods

        kill_leftover_pods(state_dir)
        network.cleanup_cluster(state.network)
        state.components = []
        state.save()
    if purge:
        import shutil

        shutil.rmtree(state_dir, ignore_errors=True)
    return stopped
