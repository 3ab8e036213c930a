"""Running the real trainer as processes on the CPU backend (fixtures re-exported by conftest).

`trainer` starts `python -m tpujob_trainer` with a clean environment (no inherited JAX or
tpujob variables), its termination message in the test's tmp dir, and JAX pinned to the CPU so
the tests mean the same on every machine. Multi-process jobs get a free loopback port for the
coordinator.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

TRAINER_ROOT = Path(__file__).resolve().parents[2] / "trainer_image"


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class TrainerProcess:
    """One running trainer: its process, its log file and its termination message path."""

    process: subprocess.Popen[bytes]
    log_path: Path
    message_path: Path
    worker: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def log(self) -> str:
        """Everything the process printed so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace")

    def message(self) -> dict[str, Any] | None:
        """The termination message as JSON, or None when none was written."""
        if not self.message_path.exists():
            return None
        data: dict[str, Any] = json.loads(self.message_path.read_text())
        return data

    def wait(self, timeout: float) -> int:
        """The exit status (negative: killed by that signal); fails the test on timeout."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            tail = self.log[-2000:]
            pytest.fail(f"trainer {self.worker} still running after {timeout}s:\n{tail}")

    def wait_for_log(self, pattern: str, timeout: float) -> re.Match[str]:
        """Block until `pattern` appears in the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log)
            if match:
                return match
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"{pattern!r} not logged by trainer {self.worker}:\n{self.log[-3000:]}")

    def last_step(self) -> int:
        """The last step the log reports."""
        steps = re.findall(r"step (\d+)/\d+ loss", self.log)
        return int(steps[-1]) if steps else 0

    def final_loss(self) -> float:
        """The loss of the last logged step."""
        return float(re.findall(r"loss=([0-9.eE+-]+)", self.log)[-1])

    def digest(self, event: str) -> str:
        """The state digest logged with `event` (`done`, `resumed from step 6`, ...)."""
        found: list[str] = re.findall(rf"{event}.*state_digest=([0-9a-f]+)", self.log)
        return found[-1]


Launcher = Callable[..., TrainerProcess]


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Launcher]:
    """Start trainers; every one still running at the end of the test is killed."""
    started: list[TrainerProcess] = []

    def launch(
        *args: str,
        env: Mapping[str, str] | None = None,
        worker: int = 0,
        name: str = "run",
        program: Sequence[str] = ("-m", "tpujob_trainer"),
    ) -> TrainerProcess:
        log_path = tmp_path / f"{name}-{worker}.log"
        message_path = tmp_path / f"{name}-{worker}.termination"
        full_env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(tmp_path),
            "PYTHONPATH": str(TRAINER_ROOT),
            "JAX_PLATFORMS": "cpu",
            "TPUJOB_TERMINATION_MESSAGE_PATH": str(message_path),
            **(env or {}),
        }
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, *program, *args],
                env=full_env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        started.append(TrainerProcess(process, log_path, message_path, worker))
        return started[-1]

    yield launch
    for item in started:
        if item.process.poll() is None:
            item.process.send_signal(signal.SIGKILL)
            item.process.wait()


@pytest.fixture
def job(trainer: Launcher) -> Callable[..., list[TrainerProcess]]:
    """Start an N-process job on loopback: the same arguments, one process per id."""

    def launch_job(
        *args: str,
        processes: int = 2,
        env: Mapping[str, str] | None = None,
        name: str = "job",
        program: Sequence[str] = ("-m", "tpujob_trainer"),
    ) -> list[TrainerProcess]:
        address = f"127.0.0.1:{free_port()}"
        return [
            trainer(
                *args,
                env={
                    "JAX_COORDINATOR_ADDRESS": address,
                    "JAX_NUM_PROCESSES": str(processes),
                    "JAX_PROCESS_ID": str(worker),
                    **(env or {}),
                },
                worker=worker,
                name=name,
                program=program,
            )
            for worker in range(processes)
        ]

    return launch_job
