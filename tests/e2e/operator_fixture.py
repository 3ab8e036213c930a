"""Running the operator as a separate process against the local cluster, the way users run it.

A real process, so tests can kill it at any moment and start it again. Its log goes to a file
the test prints on failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from tpujob.api import GROUP, PLURAL, VERSION

# Tuned for a small, loaded machine: peers notice a dead worker within seconds, pods stuck on a
# lost node are freed after a few seconds. It serves the tests' own namespaces (test-*) only, so
# the operator the chart test installs in-cluster never competes with it.
# Tests wait for a trainer to reach a step before they strike, so progress reaches the status
# every 2 s here (users get the default, 15 s). Jobs in namespaces named test-trusted-* (tests
# whose names start with test_trusted_) may taint a node by their own history.
# The operator's own namespace, where it keeps the node ledger and reads the site rules.
OPERATOR_HOME = "test-operator-home"
OPERATOR_ARGS = (
    "--namespace",
    "test-*",
    "--ledger-namespace",
    OPERATOR_HOME,
    "--trust-job-history",
    "test-trusted-*",
    "--metrics-port",
    "0",
    "--liveness-address",
    "127.0.0.1",
    "--collective-timeout",
    "15",
    "--force-delete-after",
    "3",
    "--restart-grace",
    "3",
    "--progress-interval",
    "2",
    # A node brought back by a test is trusted again by the job that blamed it this soon.
    "--lost-node-return",
    "15",
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = field(default=0)
    liveness_port: int = field(default_factory=free_port)
    args: tuple[str, ...] = OPERATOR_ARGS

    def healthy(self) -> bool:
        """Whether its /healthz answers 200 now (kopf's liveness probe)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=5
            ) as answer:
                return int(answer.status) == 200
        except OSError:
            return False

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child for its life
        log.write(f"--- start {self.starts} ---\n".encode())
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tpujob.cli",
                "operator",
                "--kubeconfig",
                str(self.kubeconfig),
                *self.args,
                "--liveness-port",
                str(self.liveness_port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL: no handler runs, no cleanup happens, as when a node dies under it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def job_status(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any]:
    body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return dict(body.get("status") or {})


def wait_status(
    custom: client.CustomObjectsApi,
    namespace: str,
    name: str,
    check: Any,
    *,
    timeout: float,
    what: str,
    operator: OperatorProcess | None = None,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = job_status(custom, namespace, name)
        if check(status):
            return status
        time.sleep(0.5)
    tail = operator.log_tail() if operator else ""
    raise AssertionError(
        f"timed out after {timeout:.0f}s waiting for {what}; status: "
        f"{status}\noperator log:\n{tail}"
    )
