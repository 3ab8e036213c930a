"""Containers as local processes: start, signal, reap, restart, and the pod status they make.

The agent keeps a `PodRuntime` per pod it runs. A container's process is `ip netns exec` +
`bwrap`, whose single child is the container's command: signals meant for the container go to
that child, so a SIGTERM reaches the trainer and not the wrapper, and the wrapper exits with the
child's status (128+N for a signal, as container runtimes report it). `pod_status` turns the
runtime into the status a kubelet would post; it is pure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpujob.local.agent.restarts import ContainerRestarts, restarts
from tpujob.local.processes import child_pids, process_start_time

MAX_TERMINATION_MESSAGE = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
RESTART_BACKOFF_MAX = 30.0


def rfc3339(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


@dataclass
class Terminated:
    exit_code: int
    reason: str
    message: str
    started_at: float | None
    finished_at: float
    signal: int | None = None

    def to_status(self, container_id: str) -> dict[str, Any]:
        state: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "finishedAt": rfc3339(self.finished_at),
            "containerID": container_id,
        }
        if self.message:
            state["message"] = self.message
        if self.started_at is not None:
            state["startedAt"] = rfc3339(self.started_at)
        # No `signal`: the kubelet never sets that field, a signal shows only as 128+N in
        # the exit code (docs/kubelet-fidelity.md), so the operator must read it from there.
        return {"terminated": state}


@dataclass
class ContainerRuntime:
    """One container of a pod, across its restarts."""

    name: str
    image: str
    directory: Path
    termination_policy: str = "File"
    proc: subprocess.Popen[bytes] | None = None
    started_at: float | None = None
    restart_count: int = 0
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None
    waiting_reason: str | None = "ContainerCreating"
    next_start_at: float = 0.0
    # resources.limits.memory in bytes: over it the container is killed as the kernel's OOM
    # killer would under the kubelet's cgroup (SIGKILL, reason OOMKilled).
    memory_limit: int | None = None
    oom_killed: bool = False
    # Its own restartPolicy and restartPolicyRules, over the pod's restartPolicy.
    restart_fields: ContainerRestarts = field(default_factory=ContainerRestarts)

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.restart_count}.log"

    @property
    def termination_file(self) -> Path:
        return self.directory / f"termination-{self.restart_count}"

    @property
    def container_id(self) -> str:
        return (
            f"tpujob-local://{self.directory.parent.parent.name}/{self.name}/{self.restart_count}"
        )

    def running(self) -> bool:
        return self.proc is not None and self.terminated is None

    def main_pid(self) -> int | None:
        """The container command's pid, once the wrapper has started it."""
        return None if self.proc is None else container_main_pid(self.proc.pid)

    def signal(self, sig: int) -> None:
        pid = self.main_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def kill_all(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def start(self, argv: list[str], env: Mapping[str, str], *, now: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.termination_file.write_bytes(b"")
        self.terminated = None
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        self.started_at = now
        self.waiting_reason = None
        started = process_start_time(self.proc.pid)
        (self.directory / "pid").write_text(json.dumps({"pid": self.proc.pid, "start": started}))

    def fail_to_start(self, message: str, *, now: float) -> None:
        """Record a start failure the way a kubelet reports one (exit 128, StartError)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = None
        self.terminated = Terminated(
            128, "StartError", message[:MAX_TERMINATION_MESSAGE], None, now
        )
        self.waiting_reason = None

    def enforce_memory_limit(self) -> None:
        """Kill the container when its processes together hold more than its memory limit."""
        if self.memory_limit is None or self.proc is None or self.terminated is not None:
            return
        if tree_rss_bytes(self.proc.pid) > self.memory_limit:
            self.oom_killed = True
            self.kill_all()

    def poll(self, *, now: float) -> bool:
        """Reap the process if it exited; True when the container just terminated."""
        if self.proc is None or self.terminated is not None:
            return False
        self.enforce_memory_limit()
        code = self.proc.poll()
        if code is None:
            return False
        self.terminated = self._terminated(code, now)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / "pid").unlink()
        return True

    def _terminated(self, code: int, now: float) -> Terminated:
        sig = -code if code < 0 else (code - 128 if code > 128 else None)
        exit_code = 128 + (-code) if code < 0 else code
        reason = "Completed" if exit_code == 0 else "Error"
        if self.oom_killed:
            reason, self.oom_killed = "OOMKilled", False
        message = _read_limited(self.termination_file)
        if not message and exit_code != 0 and self.termination_policy == "FallbackToLogsOnError":
            message = log_tail(self.log_path)
        return Terminated(exit_code, reason, message, self.started_at, now, sig)


def tree_rss_bytes(root: int) -> int:
    """Resident memory of `root` and all its descendants (0 for what has gone meanwhile)."""
    total, todo, page = 0, [root], os.sysconf("SC_PAGE_SIZE")
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        with contextlib.suppress(OSError, ValueError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return total


def container_main_pid(wrapper: int) -> int:
    """The command under `ip netns exec` (which execs bwrap) and bwrap's single child."""
    pid = wrapper
    for _ in range(3):
        children = child_pids(pid)
        if not children:
            return pid
        pid = children[0]
        if _comm(pid) not in ("bwrap", "ip"):
            return pid
    return pid


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _read_limited(path: Path) -> str:
    # As written, not stripped: the kubelet passes the file's bytes on as they are.
    try:
        with open(path, "rb") as handle:
            return handle.read(MAX_TERMINATION_MESSAGE).decode(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, lines: int = FALLBACK_LOG_LINES, limit: int = FALLBACK_LOG_BYTES) -> str:
    """The kubelet's FallbackToLogsOnError message: the last lines, at most `limit` bytes, with
    their line ends (the message of a log that ends in a newline ends in one, as on kind)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    tail = "".join(text.splitlines(keepends=True)[-lines:])
    return tail.encode()[-limit:].decode(errors="replace")


@dataclass
class PodRuntime:
    """Everything the agent runs for one pod."""

    uid: str
    namespace: str
    name: str
    node: str
    directory: Path
    ip: str = ""
    ip_index: int = -1
    netns: str = ""
    restart_policy: str = "Always"
    containers: list[ContainerRuntime] = field(default_factory=list)
    started_at: float | None = None
    start_error: str | None = None
    terminating_deadline: float | None = None
    node_lost: bool = False
    removed_kill_at: float | None = None  # gone from the API: when its SIGTERM turns SIGKILL
    mount_error: str | None = None  # a volume not set up yet: the pod waits in ContainerCreating
    mount_attempts: int = 0
    mount_retry_at: float = 0.0
    mount_error_reported: str | None = None  # the last FailedMount event the agent posted

    def all_terminated(self) -> bool:
        return bool(self.containers) and all(
            c.terminated is not None and not self.should_restart(c) for c in self.containers
        )

    def should_restart(self, container: ContainerRuntime) -> bool:
        if container.terminated is None or self.terminating_deadline is not None:
            return False
        if self.node_lost:
            return False
        return restarts(
            self.restart_policy, container.restart_fields, container.terminated.exit_code
        )

    def phase(self) -> str:
        if not self.containers or self.started_at is None or self.mount_error is not None:
            return "Pending"
        if self.all_terminated():
            ok = all(
                c.terminated is not None and c.terminated.exit_code == 0 for c in self.containers
            )
            return "Succeeded" if ok else "Failed"
        return "Running"

    def write_meta(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "meta.json").write_text(
            json.dumps(
                {
                    "uid": self.uid,
                    "namespace": self.namespace,
                    "name": self.name,
                    "node": self.node,
                    "netns": self.netns,
                    "ip": self.ip,
                }
            )
        )


def restart_delay(restart_count: int) -> float:
    """Crash-loop back-off: 1 s doubling to 30 s (a kubelet uses 10 s to 5 min)."""
    return float(min(RESTART_BACKOFF_MAX, 2 ** max(0, restart_count - 1)))


# The conditions the kubelet writes on every status update (PodScheduled too: it sets it True
# even for a pod bound by `nodeName`, which no scheduler saw).
OWNED_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
    "PodScheduled",
)


TPU_RESOURCE = "google.com/tpu"


def tpu_devices(spec: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The google.com/tpu device IDs the device plugin gives each container of a pod.

    Chips are handed out in container order, `accel0` upwards, as the plugin numbers a
    host's /dev/accel* devices. Containers that ask for none get none.
    """
    devices: dict[str, tuple[str, ...]] = {}
    next_chip = 0
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = (resources.get("limits") or {}).get(TPU_RESOURCE) or (
            resources.get("requests") or {}
        ).get(TPU_RESOURCE)
        try:
            count = max(0, int(wanted or 0))
        except (TypeError, ValueError):
            count = 0
        if count:
            devices[str(container.get("name"))] = tuple(
                f"accel{i}" for i in range(next_chip, next_chip + count)
            )
            next_chip += count
    return devices


def allocated_resources_status(devices: tuple[str, ...], *, healthy: bool) -> list[dict[str, Any]]:
    """containerStatuses[].allocatedResourcesStatus for a container's TPU devices (KEP-4680)."""
    if not devices:
        return []
    health = "Healthy" if healthy else "Unhealthy"
    return [
        {"name": TPU_RESOURCE, "resources": [{"resourceID": d, "health": health} for d in devices]}
    ]


def pod_status(
    rt: PodRuntime,
    previous: Mapping[str, Any],
    *,
    now: float,
    tpu: Mapping[str, tuple[str, ...]] | None = None,
    tpu_healthy: bool = True,
) -> dict[str, Any]:
    """The status the agent posts for `rt`, keeping conditions other components own.

    `tpu` maps container names to their TPU device IDs (`tpu_devices` of the pod's spec);
    with it, each container's allocatedResourcesStatus reports those devices Healthy, or
    Unhealthy when the node's chips have failed, as the kubelet does from the device
    plugin's ListAndWatch.
    """
    phase = rt.phase()
    ready = phase == "Running" and all(c.running() for c in rt.containers)
    stamp = rfc3339(now)
    kept = [c for c in (previous.get("conditions") or []) if c.get("type") not in OWNED_CONDITIONS]
    old = {c.get("type"): c for c in (previous.get("conditions") or [])}

    def condition(kind: str, value: bool) -> dict[str, Any]:
        status = "True" if value else "False"
        prior = old.get(kind)
        since = prior.get("lastTransitionTime") if prior and prior.get("status") == status else None
        cond: dict[str, Any] = {
            "type": kind,
            "status": status,
            "lastTransitionTime": since or stamp,
        }
        if value and kind == "Initialized" and phase == "Succeeded":
            cond["reason"] = "PodCompleted"  # as the kubelet says it, on Succeeded only
        if not value and kind in ("Ready", "ContainersReady"):
            # The kubelet's reasons (pkg/kubelet/status/generate.go), as measured on kind.
            if phase in ("Succeeded", "Failed"):
                cond["reason"] = "PodCompleted" if phase == "Succeeded" else "PodFailed"
            else:
                cond["reason"] = "ContainersNotReady"
                unready = " ".join(c.name for c in rt.containers if not c.running())
                cond["message"] = f"containers with unready status: [{unready}]"
        return cond

    conditions = [
        # No sandbox before the volumes are set up, on kind: False while a mount waits.
        condition(
            "PodReadyToStartContainers",
            bool(rt.ip) and rt.mount_error is None and phase in ("Pending", "Running"),
        ),
        condition("Initialized", True),
        condition("ContainersReady", ready),
        condition("Ready", ready),
        condition("PodScheduled", True),
        *kept,
    ]
    statuses = []
    for c in rt.containers:
        st: dict[str, Any] = {
            "name": c.name,
            "image": c.image,
            "imageID": "",
            "containerID": c.container_id,
            "restartCount": c.restart_count,
            "ready": c.running(),
            "started": c.running(),
        }
        if c.terminated is not None and not rt.should_restart(c):
            st["state"] = c.terminated.to_status(c.container_id)
        elif c.running() and c.started_at is not None:
            st["state"] = {"running": {"startedAt": rfc3339(c.started_at)}}
        elif c.terminated is not None:
            st["state"] = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container {c.name}",
                }
            }
        else:
            st["state"] = {"waiting": {"reason": c.waiting_reason or "ContainerCreating"}}
        last = (
            c.terminated
            if (c.terminated is not None and rt.should_restart(c))
            else c.last_terminated
        )
        st["lastState"] = last.to_status(c.container_id) if last is not None else {}
        health = allocated_resources_status((tpu or {}).get(c.name, ()), healthy=tpu_healthy)
        if health:
            st["allocatedResourcesStatus"] = health
        statuses.append(st)
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "containerStatuses": statuses,
    }
    if rt.ip:
        status["podIP"], status["podIPs"] = rt.ip, [{"ip": rt.ip}]
    if rt.started_at is not None:
        status["startTime"] = rfc3339(rt.started_at)
    if rt.start_error and phase == "Failed":
        status["message"] = rt.start_error
    return status


def kill_leftover_pods(state_dir: Path) -> int:
    """SIGKILL every container process recorded under the agent's pod folders."""
    killed = 0
    for pid_file in (state_dir / "agent" / "pods").glob("*/containers/*/pid"):
        try:
            data = json.loads(pid_file.read_text())
        except (OSError, ValueError):
            continue
        if process_start_time(int(data["pid"])) == data.get("start"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(data["pid"]), signal.SIGKILL)
                killed += 1
        pid_file.unlink(missing_ok=True)
    return killed
