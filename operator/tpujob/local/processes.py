"""Start, watch and stop the local cluster's long-running processes.

Each component runs in its own session (so `down` can signal the whole process group), writes
its output to `DIR/logs/NAME.log`, and is recorded in the state file by pid and start time;
the start time guards against signalling an unrelated process that reused the pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class ComponentError(RuntimeError):
    """A component could not be started or died; the message is one line for the user."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def child_pids(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The children of `pid`, as the kernel lists them per thread (main thread first); empty
    when it has none or is gone."""
    children: list[int] = []
    for task in sorted(
        (proc / str(pid) / "task").glob("*/children"), key=lambda t: t.parent.name != str(pid)
    ):
        try:
            children.extend(int(c) for c in task.read_text().split())
        except (OSError, ValueError):
            continue
    return children


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` in clock ticks, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass(frozen=True)
class Running:
    """A started process as recorded in the state file."""

    name: str
    pid: int
    start_time: int
    log: str

    def alive(self) -> bool:
        return process_start_time(self.pid) == self.start_time

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "start_time": self.start_time, "log": self.log}

    @staticmethod
    def from_json(data: dict[str, object]) -> Running:
        return Running(
            str(data["name"]), int(str(data["pid"])), int(str(data["start_time"])), str(data["log"])
        )


def start(
    name: str,
    argv: Sequence[str],
    log_dir: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Running:
    """Start `argv` detached from the caller, its output appended to `log_dir/NAME.log`."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=cwd,
            )
        except OSError as err:
            raise ComponentError(f"{name}: cannot start {argv[0]}: {err.strerror}") from err
    started = process_start_time(proc.pid)
    if started is None:
        code = proc.wait()
        raise ComponentError(f"{name} exited with code {code} at once: {last_line(log_path)}")
    return Running(name, proc.pid, started, str(log_path))


def last_line(path: Path | str, limit: int = 300) -> str:
    """The last non-empty line of a log, for one-line error reports."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 8192))
            lines = [ln.strip() for ln in handle.read().decode(errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    lines = [ln for ln in lines if ln]
    return lines[-1][:limit] if lines else "(empty log)"


def stop(running: Running, *, grace: float = 10.0) -> None:
    """SIGTERM the process group, wait up to `grace` seconds, then SIGKILL it."""
    if not running.alive():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(running.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not running.alive():
            return
        _reap(running.pid)
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(running.pid, signal.SIGKILL)
    for _ in range(50):
        _reap(running.pid)
        if not running.alive():
            return
        time.sleep(0.1)


def _reap(pid: int) -> None:
    # Our own children must be waited for, or they linger as zombies that still look alive.
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
