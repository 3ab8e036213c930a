"""`tpujob local` refuses bad situations in one clear line and leaves no process behind."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import LocalCluster

from tpujob.local import firewall, network
from tpujob.local.binaries import binary_dir

pytestmark = pytest.mark.cluster


def local(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpujob.cli", "local", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **(env or {})},
    )


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args and "pytest" not in args:
            found.append(args)
    return found


def test_up_on_a_running_cluster_says_so_and_changes_nothing(cluster: LocalCluster) -> None:
    before = (cluster.state_dir / "state.json").read_text()
    result = local("up", "--state-dir", str(cluster.state_dir))
    assert result.returncode == 0
    assert "already running" in result.stdout
    assert (cluster.state_dir / "state.json").read_text() == before


def test_port_in_use_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = local("up", "--state-dir", str(tmp_path), "--apiserver-port", str(port))
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert f"port {port}" in result.stderr
    assert processes_mentioning(str(tmp_path)) == []


def test_busy_state_dir_is_refused(tmp_path: Path) -> None:
    with open(tmp_path / "lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = local("up", "--state-dir", str(tmp_path))
    assert result.returncode == 1
    assert "busy" in result.stderr


def test_missing_binary_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    result = local("up", "--state-dir", str(tmp_path / "state"), env={"TPUJOB_BIN_DIR": str(empty)})
    assert result.returncode == 1
    assert "missing binary etcd" in result.stderr


def test_component_dying_at_start_is_reported_and_the_rest_stopped(tmp_path: Path) -> None:
    bins = tmp_path / "bin"
    bins.mkdir()
    for name in ("etcd", "kube-scheduler", "kube-controller-manager"):
        (bins / name).symlink_to(binary_dir() / name)
    broken = bins / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'error: storage backend is on fire' >&2\nexit 1\n")
    broken.chmod(0o755)
    state = tmp_path / "state"
    result = local("up", "--state-dir", str(state), env={"TPUJOB_BIN_DIR": str(bins)})
    assert result.returncode == 1
    assert "kube-apiserver" in result.stderr
    assert "storage backend is on fire" in result.stderr
    assert processes_mentioning(str(state)) == []
    # The bridge and its FORWARD rule came before the components; both are gone with them.
    bridge = network.choose_network(str(state.resolve())).bridge
    assert not Path("/sys/class/net", bridge).exists()
    assert firewall.bridge_rules(bridge) == []
