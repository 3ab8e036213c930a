"""Start and tear down one pod on a local node: its network, folders, volumes and containers.

`PodRunner` is the agent's sandbox manager. It owns the pod address pool and the cluster-wide
hosts file that makes `hostname.subdomain.namespace.svc.cluster.local` names resolve inside
pods; the file is rewritten in place because every pod has it bind-mounted (a rename would
leave the pods looking at the old inode).
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tpujob.local import network
from tpujob.local.agent import claims, sandbox
from tpujob.local.agent.lookups import ApiLookups
from tpujob.local.agent.restarts import container_restarts
from tpujob.local.agent.runtime import ContainerRuntime, PodRuntime
from tpujob.observed.training import quantity_bytes

DEFAULT_TERMINATION_PATH = "/dev/termination-log"
MOUNT_BACKOFF_MAX = 30.0


def mount_backoff(attempts: int) -> float:
    """Seconds before setting up a pod's volumes again: 0.5 s doubling to 30 s (the kubelet's
    volume manager backs off from 0.5 s to about 2 minutes)."""
    return float(min(MOUNT_BACKOFF_MAX, 0.5 * 2 ** max(0, attempts - 1)))


class PodRunner:
    def __init__(
        self,
        root: Path,
        net: network.ClusterNetwork,
        api: sandbox.ApiEndpoint,
        lookups: sandbox.Lookups,
        claim_lookups: claims.ClaimLookups | None = None,
    ) -> None:
        self.root = root
        self.net = net
        self.api = api
        self.lookups = lookups
        # Claims are read as the node, through the same client as the other lookups.
        if claim_lookups is None and isinstance(lookups, ApiLookups):
            claim_lookups = claims.ApiClaims(lookups.core)
        self.claim_lookups = claim_lookups
        self.hosts_file = root / "hosts"
        self.root_entries = sandbox.host_root_entries()
        self.runtime_binds = sandbox.own_paths_under_tmp()
        self._used: set[int] = set()
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)
        self.hosts_file.write_text("127.0.0.1 localhost\n")

    def _allocate(self) -> int:
        with self._lock:
            index = next(i for i in range(1, 60000) if i not in self._used)
            self._used.add(index)
            return index

    def create(self, pod: Mapping[str, Any], *, now: float) -> PodRuntime:
        """Build the sandbox and start every container; start failures are recorded, not raised."""
        meta, spec = pod["metadata"], pod["spec"]
        rt = PodRuntime(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=spec["nodeName"],
            directory=self.root / "pods" / meta["uid"],
            restart_policy=spec.get("restartPolicy", "Always"),
        )
        for c in spec.get("containers") or []:
            rt.containers.append(
                ContainerRuntime(
                    name=c["name"],
                    image=c.get("image", ""),
                    directory=rt.directory / "containers" / c["name"],
                    termination_policy=c.get("terminationMessagePolicy", "File"),
                    memory_limit=quantity_bytes(
                        ((c.get("resources") or {}).get("limits") or {}).get("memory")
                    ),
                    restart_fields=container_restarts(c),
                )
            )
        rt.ip_index = self._allocate()
        rt.ip = self.net.pod_address(rt.ip_index)
        rt.netns = network.create_pod_network(self.net, rt.uid, rt.ip)
        (rt.directory / "tmp").mkdir(parents=True, exist_ok=True)
        rt.write_meta()
        rt.started_at = now
        self.mount_and_start(pod, rt, now=now)
        return rt

    def mount_and_start(self, pod: Mapping[str, Any], rt: PodRuntime, *, now: float) -> None:
        """Set up the volumes, then start every container. A volume that cannot be set up yet
        leaves the pod waiting (`rt.mount_error`, tried again at `rt.mount_retry_at`), as the
        kubelet keeps such a pod in ContainerCreating; what cannot start at all fails it."""
        try:
            volumes = sandbox.prepare_volumes(
                pod, rt.directory, pod_ip=rt.ip, lookups=self.lookups, claim_path=self._claim_path
            )
        except sandbox.MountError as err:
            rt.mount_error = str(err)
            rt.mount_attempts += 1
            rt.mount_retry_at = now + mount_backoff(rt.mount_attempts)
            return
        except sandbox.StartError as err:
            rt.mount_error = None
            rt.start_error = str(err)
            for c in rt.containers:
                c.fail_to_start(str(err), now=now)
            return
        rt.mount_error = None
        for c in rt.containers:
            self.start_container(pod, rt, c, volumes, now=now)

    def start_container(
        self,
        pod: Mapping[str, Any],
        rt: PodRuntime,
        c: ContainerRuntime,
        volumes: Mapping[str, Path] | None = None,
        *,
        now: float,
    ) -> None:
        spec = next(s for s in pod["spec"]["containers"] if s["name"] == c.name)
        try:
            if volumes is None:
                volumes = {
                    v["name"]: self._volume_path(rt, v) for v in pod["spec"].get("volumes") or []
                }
            env = sandbox.container_env(pod, spec, pod_ip=rt.ip, api=self.api, lookups=self.lookups)
            argv = sandbox.resolve_command(spec, env)
            mounts = sandbox.container_mounts(pod, spec, volumes)
        except sandbox.StartError as err:
            c.fail_to_start(str(err), now=now)
            return
        c.directory.mkdir(parents=True, exist_ok=True)
        c.termination_file.write_bytes(b"")
        pod_spec = pod["spec"]
        hostname = pod_spec.get("hostname") or pod["metadata"]["name"]
        full = sandbox.bwrap_argv(
            netns=rt.netns,
            hostname=hostname[:63],
            hosts_file=self.hosts_file,
            tmp_dir=rt.directory / "tmp",
            termination_file=c.termination_file,
            termination_path=spec.get("terminationMessagePath", DEFAULT_TERMINATION_PATH),
            mounts=[*mounts, *self.runtime_binds],
            working_dir=spec.get("workingDir"),
            argv=argv,
            root_entries=self.root_entries,
        )
        c.start(full, env, now=now)

    def refresh(self, pod: Mapping[str, Any], rt: PodRuntime) -> None:
        """Keep a running pod's downward-API files equal to its labels and annotations."""
        if rt.start_error is None and rt.ip:
            sandbox.refresh_downward_volumes(pod, rt.directory, pod_ip=rt.ip)

    def _volume_path(self, rt: PodRuntime, vol: Mapping[str, Any]) -> Path:
        if "hostPath" in vol:
            return Path(str(vol["hostPath"]["path"]))
        if "persistentVolumeClaim" in vol:
            return self._claim_path(rt.namespace, str(vol["persistentVolumeClaim"]["claimName"]))
        return rt.directory / "volumes" / str(vol["name"])

    def _claim_path(self, namespace: str, claim_name: str) -> Path:
        if self.claim_lookups is None:
            raise sandbox.StartError(f"claim {claim_name!r}: this node cannot look up claims")
        try:
            return claims.claim_path(namespace, claim_name, self.claim_lookups)
        except claims.ClaimError as err:
            raise sandbox.StartError(str(err)) from err

    def release_network(self, rt: PodRuntime) -> None:
        """The sandbox of a finished pod goes away; its folders (logs) stay for `logs`."""
        if rt.netns:
            network.delete_pod_network(self.net, rt.uid)
            rt.netns = ""
        # Free the address once: a pod that finished releases it here, and its later removal
        # from the API must not free it again, by then it may belong to a newer pod, and two
        # pods on one address break each other's connections.
        with self._lock:
            self._used.discard(rt.ip_index)
            rt.ip_index = -1

    def remove(self, rt: PodRuntime) -> None:
        self.release_network(rt)
        for c in rt.containers:
            c.kill_all()
        shutil.rmtree(rt.directory / "volumes", ignore_errors=True)

    def write_hosts(self, pods: Iterable[tuple[PodRuntime, Mapping[str, Any]]]) -> None:
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        for rt, pod in pods:
            if not rt.ip or not rt.netns:
                continue
            spec, ns = pod["spec"], rt.namespace
            host = spec.get("hostname") or rt.name
            names = [host]
            if sub := spec.get("subdomain"):
                fqdn = f"{host}.{sub}.{ns}.svc.cluster.local"
                names = [
                    fqdn,
                    f"{host}.{sub}.{ns}.svc",
                    f"{host}.{sub}.{ns}",
                    f"{host}.{sub}",
                    host,
                ]
            lines.append(f"{rt.ip} {' '.join(dict.fromkeys(names))}")
        content = "\n".join(lines) + "\n"
        with open(self.hosts_file, "r+") as handle:
            if handle.read() == content:
                return
            handle.seek(0)
            handle.write(content)
            handle.truncate()
