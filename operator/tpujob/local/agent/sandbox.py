"""How one container of a pod becomes a local process: environment, mounts and the argv.

The process runs inside the pod's network namespace (`ip netns exec`) and a private mount
namespace (`bwrap`): the host's file system is shared read-only, as an image-less runtime must
share it (the commands come from this machine), while `/etc/hosts`, `/tmp`, `/dev`, the
termination message file, the pod's volumes and the service-account token are the pod's own, at
the paths the pod spec names, and only the pod's volumes are writable host directories. The
process keeps the agent's user but holds no capabilities, runs in its own session (a terminal
signal of the agent's does not reach it) and dies with the agent. `runAsUser` and `runAsGroup`
are not emulated: a pod's processes run as the agent's user, which owns every directory the
agent makes for it; a read-only root filesystem is what every pod gets here anyway. Nothing
here talks to the API server; lookups of ConfigMaps, Secrets and tokens come in through
`Lookups`, claims through `claim_path`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tpujob.local.agent import hostpaths

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class StartError(RuntimeError):
    """The container cannot start; reported as a kubelet reports StartError."""


class MountError(StartError):
    """A volume cannot be set up yet: the pod waits in ContainerCreating and the node tries
    again, as the kubelet does (a FailedMount event), rather than failing the pod."""


class UnsupportedError(StartError):
    """What the local node cannot do at all (an unsupported volume type): the pod fails."""


class Lookups(Protocol):
    """What a pod's environment and volumes need from the API server."""

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None: ...

    def secret(self, namespace: str, name: str) -> dict[str, str] | None: ...

    def token(
        self,
        namespace: str,
        service_account: str,
        *,
        pod: str,
        pod_uid: str,
        audiences: list[str],
        seconds: int,
    ) -> str: ...

    def ca_cert(self) -> str: ...


@dataclass(frozen=True)
class ApiEndpoint:
    """Where in-cluster clients reach the API server from inside a pod."""

    host: str
    port: int


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    """The downward-API value of `path` (metadata.name, metadata.labels['k'], status.podIP...)."""
    meta, spec = pod["metadata"], pod["spec"]
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.hostIP": "127.0.0.1",
        "status.podIPs": pod_ip,
    }
    if path in simple:
        return str(simple[path])
    for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((meta.get(key) or {}).get(path[len(prefix) + 2 : -2], ""))
        if path == prefix:
            return "\n".join(f'{k}="{v}"' for k, v in sorted((meta.get(key) or {}).items()))
    raise StartError(f"unsupported fieldRef {path!r}")


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    pod_ip: str,
    api: ApiEndpoint,
    lookups: Lookups,
) -> dict[str, str]:
    """The environment a kubelet would give `container`."""
    ns = pod["metadata"]["namespace"]
    env: dict[str, str] = {
        "PATH": f"{Path(sys.executable).parent}:{DEFAULT_PATH}",
        "HOME": "/root",
        "HOSTNAME": pod["spec"].get("hostname") or pod["metadata"]["name"],
        "KUBERNETES_SERVICE_HOST": api.host,
        "KUBERNETES_SERVICE_PORT": str(api.port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(api.port),
        "KUBERNETES_PORT": f"tcp://{api.host}:{api.port}",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    # The local image is the Python environment the node runs in, with the sources it was
    # pointed at: a container runs the code the agent was started with, as an image's ENV would.
    if python_path := os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = python_path
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if ref := source.get("configMapRef"):
            data = lookups.config_map(ns, ref["name"])
        elif ref := source.get("secretRef"):
            data = lookups.secret(ns, ref["name"])
        else:
            continue
        if data is None and not ref.get("optional"):
            raise StartError(f"envFrom: {ref['name']!r} not found")
        env.update({prefix + k: v for k, v in (data or {}).items()})
    for item in container.get("env") or []:
        env[item["name"]] = _env_value(pod, container, item, pod_ip, lookups)
    return env


def _env_value(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    item: Mapping[str, Any],
    pod_ip: str,
    lookups: Lookups,
) -> str:
    if "valueFrom" not in item:
        return str(item.get("value", ""))
    source = item["valueFrom"]
    ns = pod["metadata"]["namespace"]
    if ref := source.get("fieldRef"):
        return field_value(pod, ref["fieldPath"], pod_ip)
    if ref := source.get("resourceFieldRef"):
        resources = container.get("resources") or {}
        kind, _, name = ref["resource"].partition(".")
        return str((resources.get(kind) or {}).get(name, "0"))
    for key, lookup in (("configMapKeyRef", lookups.config_map), ("secretKeyRef", lookups.secret)):
        if ref := source.get(key):
            data = lookup(ns, ref["name"]) or {}
            if ref["key"] in data:
                return data[ref["key"]]
            if ref.get("optional"):
                return ""
            raise StartError(f"env {item['name']}: key {ref['key']!r} not in {ref['name']!r}")
    raise StartError(f"env {item['name']}: unsupported valueFrom")


# (namespace, claim name) -> the host directory of the PersistentVolume bound to the claim.
ClaimPath = Callable[[str, str], Path]


def prepare_volumes(
    pod: Mapping[str, Any],
    pod_dir: Path,
    *,
    pod_ip: str,
    lookups: Lookups,
    claim_path: ClaimPath | None = None,
) -> dict[str, Path]:
    """Materialise the pod's volumes on the host; returns volume name -> host path.

    A volume that cannot be set up yet (a claim not bound, a ConfigMap not there, a hostPath
    of the wrong type) raises MountError, which the node retries as the kubelet does; one the
    local node cannot mount at all raises StartError."""
    paths: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        try:
            paths[vol["name"]] = _prepare_volume(
                pod, vol, pod_dir, pod_ip=pod_ip, lookups=lookups, claim_path=claim_path
            )
        except UnsupportedError:
            raise
        except (StartError, OSError) as err:
            raise MountError(
                f'MountVolume.SetUp failed for volume "{vol["name"]}" : {err}'
            ) from err
    return paths


def _prepare_volume(
    pod: Mapping[str, Any],
    vol: Mapping[str, Any],
    pod_dir: Path,
    *,
    pod_ip: str,
    lookups: Lookups,
    claim_path: ClaimPath | None,
) -> Path:
    meta = pod["metadata"]
    name = str(vol["name"])
    target = pod_dir / "volumes" / name
    if "emptyDir" in vol:
        target.mkdir(parents=True, exist_ok=True)
    elif "hostPath" in vol:
        try:
            target = hostpaths.prepare(Path(vol["hostPath"]["path"]), vol["hostPath"].get("type"))
        except hostpaths.HostPathError as err:
            raise StartError(str(err)) from err
    elif "persistentVolumeClaim" in vol:
        if claim_path is None:
            raise UnsupportedError(f"volume {name!r}: this node cannot look up claims")
        target = claim_path(meta["namespace"], vol["persistentVolumeClaim"]["claimName"])
    elif "projected" in vol:
        _write_files(target, _projected_files(pod, vol["projected"], pod_ip, lookups))
    elif "configMap" in vol:
        data = lookups.config_map(meta["namespace"], vol["configMap"]["name"])
        if data is None and not vol["configMap"].get("optional"):
            raise StartError(f'configmap "{vol["configMap"]["name"]}" not found')
        _write_files(target, data or {})
    elif "secret" in vol:
        data = lookups.secret(meta["namespace"], vol["secret"]["secretName"])
        if data is None and not vol["secret"].get("optional"):
            raise StartError(f'secret "{vol["secret"]["secretName"]}" not found')
        _write_files(target, data or {})
    elif "downwardAPI" in vol:
        _write_files(
            target,
            {
                i["path"]: field_value(pod, i["fieldRef"]["fieldPath"], pod_ip)
                for i in vol["downwardAPI"].get("items", [])
                if "fieldRef" in i
            },
        )
    else:
        raise UnsupportedError(f"volume {name!r}: unsupported volume type")
    return target


def refresh_downward_volumes(pod: Mapping[str, Any], pod_dir: Path, *, pod_ip: str) -> int:
    """Rewrite the files of the pod's downwardAPI volumes whose value changed (labels and
    annotations change while a pod runs, and the kubelet keeps these files current); each
    is replaced whole, so a reader never sees half a value. Returns how many changed."""
    changed = 0
    for vol in pod["spec"].get("volumes") or []:
        if "downwardAPI" not in vol:
            continue
        target = pod_dir / "volumes" / vol["name"]
        for item in vol["downwardAPI"].get("items") or []:
            if "fieldRef" not in item:
                continue
            value = field_value(pod, item["fieldRef"]["fieldPath"], pod_ip)
            path = target / item["path"]
            try:
                if path.read_text() == value:
                    continue
            except OSError:
                pass
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.new")
            tmp.write_text(value)
            tmp.replace(path)
            changed += 1
    return changed


def _projected_files(
    pod: Mapping[str, Any], projected: Mapping[str, Any], pod_ip: str, lookups: Lookups
) -> dict[str, str]:
    meta, spec = pod["metadata"], pod["spec"]
    files: dict[str, str] = {}
    for source in projected.get("sources") or []:
        if token := source.get("serviceAccountToken"):
            files[token["path"]] = lookups.token(
                meta["namespace"],
                spec.get("serviceAccountName") or "default",
                pod=meta["name"],
                pod_uid=meta["uid"],
                audiences=[token["audience"]] if token.get("audience") else [],
                seconds=int(token.get("expirationSeconds", 3607)),
            )
        elif cm := source.get("configMap"):
            if cm["name"] == "kube-root-ca.crt":
                data: dict[str, str] | None = {"ca.crt": lookups.ca_cert()}
            else:
                data = lookups.config_map(meta["namespace"], cm["name"])
            for item in cm.get("items") or [{"key": k, "path": k} for k in (data or {})]:
                if data and item["key"] in data:
                    files[item["path"]] = data[item["key"]]
        elif down := source.get("downwardAPI"):
            for item in down.get("items") or []:
                if "fieldRef" in item:
                    files[item["path"]] = field_value(pod, item["fieldRef"]["fieldPath"], pod_ip)
    return files


def _write_files(directory: Path, files: Mapping[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def expand_references(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of `$(NAME)` in command and args, as the kubelet does it.

    `$(NAME)` becomes the container's variable NAME when it has one and stays as written when
    not; `$$` is a literal `$` (so `$$(NAME)` is the text `$(NAME)`).
    """
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif (
            text.startswith("$(", i)
            and (end := text.find(")", i + 2)) != -1
            and text[i + 2 : end] in env
        ):
            out.append(env[text[i + 2 : end]])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def resolve_command(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with `$(NAME)` expanded, the executable found on the container's PATH
    as a runtime would."""
    argv = [
        expand_references(str(a), env)
        for a in [*(container.get("command") or []), *(container.get("args") or [])]
    ]
    if not argv:
        raise StartError(
            "no command: the local node runs the container's command on this "
            "machine and cannot read an image's entrypoint; set `command`"
        )
    exe = argv[0]
    found = exe if "/" in exe else shutil.which(exe, path=env.get("PATH", DEFAULT_PATH))
    if found is None or not os.access(found, os.X_OK):
        raise StartError(f'exec: "{exe}": executable file not found in $PATH')
    return [found, *argv[1:]]


@dataclass(frozen=True)
class Mount:
    source: Path
    target: str
    read_only: bool = False


def container_mounts(
    pod: Mapping[str, Any], container: Mapping[str, Any], volumes: Mapping[str, Path]
) -> list[Mount]:
    # A claim mounted readOnly in the pod's volume is read-only in every container.
    read_only_volumes = {
        v["name"]
        for v in pod["spec"].get("volumes") or []
        if (v.get("persistentVolumeClaim") or {}).get("readOnly")
    }
    mounts = []
    for vm in container.get("volumeMounts") or []:
        source = volumes.get(vm["name"])
        if source is None:
            raise StartError(f"volumeMount {vm['name']!r} names no volume of the pod")
        if vm.get("subPath"):
            if ".." in Path(vm["subPath"]).parts or Path(vm["subPath"]).is_absolute():
                raise StartError(f"volumeMount {vm['name']!r}: subPath must stay in the volume")
            source = source / vm["subPath"]
            source.mkdir(parents=True, exist_ok=True)
        if folder := host_folder_holding(vm["mountPath"]):
            raise StartError(
                f"volumeMount {vm['name']!r}: the local node cannot make the mount point "
                f"{vm['mountPath']}: {folder} is this machine's folder, read-only in pods "
                "(mount under /tmp, /run, /var/run, /dev/shm or a new top-level folder)"
            )
        read_only = bool(vm.get("readOnly")) or vm["name"] in read_only_volumes
        mounts.append(Mount(source, vm["mountPath"], read_only))
    return mounts


@dataclass(frozen=True)
class RootEntry:
    """A top-level entry of the host's file system: a directory to bind or a symlink."""

    name: str
    symlink_target: str | None = None


# Made fresh per pod rather than shared with the host.
PRIVATE_ROOT_ENTRIES = frozenset({"proc", "dev", "sys", "tmp", "run"})


def host_root_entries(root: Path = Path("/")) -> list[RootEntry]:
    entries = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in PRIVATE_ROOT_ENTRIES or entry.name.startswith("."):
            continue
        if entry.is_symlink():
            entries.append(RootEntry(entry.name, os.readlink(entry.path)))
        elif entry.is_dir():
            entries.append(RootEntry(entry.name))
    return entries


def host_folder_holding(target: str) -> str | None:
    """The host folder a missing mount point `target` would have to be made in, if any.

    A container's root is its image, where the runtime makes any mount point; a pod's root
    here is a tmpfs holding read-only binds of this machine's top-level folders, so a mount
    point that does not exist under one of them (/etc/x) cannot be made. Measured on kind:
    docs/kubelet-fidelity.md."""
    resolved = Path(resolve_target(target))
    if len(resolved.parts) < 3 or resolved.parts[1] in PRIVATE_ROOT_ENTRIES:
        return None  # a new top-level folder, or under the pod's own /tmp, /run, /dev
    top = Path("/", resolved.parts[1])
    if resolved.exists() or not top.is_dir():
        return None
    return str(top)


def resolve_target(target: str) -> str:
    """`target` with symlinks in its existing parents resolved, as the sandbox will see them.

    The sandbox mirrors the host's layout, so /var/run/secrets/... (with /var/run -> /run)
    becomes /run/secrets/..., which lands in the pod's private /run.
    """
    path = Path(target)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return str(Path(os.path.realpath(existing)) / path.relative_to(existing))


def own_paths_under_tmp() -> list[Mount]:
    """Read-only binds for this Python environment when it lives under /tmp.

    Pods get a private /tmp, which would hide a virtual environment (or an editable install's
    sources) kept there; the commands pods run come from this environment. They are mounted
    after the pod's own volumes, so an emptyDir at /tmp does not hide them either.
    """
    candidates = {Path(sys.prefix).resolve(), *(Path(p).resolve() for p in sys.path if p)}
    tmp = Path("/tmp")
    under = sorted(p for p in candidates if p.is_relative_to(tmp) and p != tmp and p.is_dir())
    kept: list[Path] = []
    for path in under:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return [Mount(p, str(p), read_only=True) for p in kept]


# No capabilities (the agent runs as root), a session of its own (setsid: no controlling
# terminal to inject input through), and death with the agent, so no pod outlives its node.
SANDBOX_OPTIONS = ("--cap-drop", "ALL", "--new-session", "--die-with-parent")


def bwrap_argv(
    *,
    netns: str,
    hostname: str,
    hosts_file: Path,
    tmp_dir: Path,
    termination_file: Path,
    termination_path: str,
    mounts: list[Mount],
    working_dir: str | None,
    argv: list[str],
    root_entries: list[RootEntry],
) -> list[str]:
    """The full argv: enter the pod's network namespace, then its private mount namespace.

    The root is a fresh tmpfs holding read-only binds of the host's top-level directories, so
    the mount points a pod needs (/checkpoints, /var/run/secrets/..., /dev/termination-log) are
    made in the pod's own tmpfs and never on the host, and the pod writes only its own /tmp,
    its termination file and the volumes it mounts.
    """
    cmd = ["ip", "netns", "exec", netns, "bwrap", *SANDBOX_OPTIONS, "--tmpfs", "/"]
    for entry in root_entries:
        if entry.symlink_target is not None:
            cmd += ["--symlink", entry.symlink_target, f"/{entry.name}"]
        else:
            cmd += ["--ro-bind", f"/{entry.name}", f"/{entry.name}"]
    cmd += [
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--ro-bind",
        "/sys",
        "/sys",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/dev/shm",
        "--bind",
        str(tmp_dir),
        "/tmp",
        "--ro-bind",
        str(hosts_file),
        "/etc/hosts",
        "--unshare-uts",
        "--hostname",
        hostname,
        "--bind",
        str(termination_file),
        termination_path,
    ]
    for mount in mounts:
        cmd += [
            "--ro-bind" if mount.read_only else "--bind",
            str(mount.source),
            resolve_target(mount.target),
        ]
    if working_dir:
        cmd += ["--chdir", working_dir]
    return [*cmd, "--", *argv]
