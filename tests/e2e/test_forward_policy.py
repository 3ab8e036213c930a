"""The local cluster works on a machine where Docker runs: FORWARD policy DROP, bridge netfilter on.

Docker, when its daemon starts, sets the filter table's FORWARD policy to DROP and loads
`br_netfilter` with `net.bridge.bridge-nf-call-iptables=1`, so frames between two ports of any
Linux bridge go through that policy. These tests do exactly that with `iptables` and the sysctl,
without starting Docker, for as short a time as they can: other local clusters on the machine
(without the rule) lose their pod traffic meanwhile. The previous policy and sysctl (and
`br_netfilter`, if it had to be loaded) are restored when the test ends, whatever its outcome.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, training_job

from tpujob.local import controlplane, firewall, network

BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
SERVE = (
    "import socket\n"
    "s = socket.create_server(('0.0.0.0', 7000))\n"
    "print('listening', flush=True)\n"
    "while True:\n"
    "    s.accept()[0].close()\n"
)
CONNECT = (
    "import socket, sys\n"
    "socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])).close()\n"
)


def iptables(*args: str) -> str:
    binary = shutil.which("iptables")
    assert binary is not None, "no iptables command (`make system-deps` installs it)"
    proc = subprocess.run(
        [binary, "-w", "10", *args], capture_output=True, text=True, check=False, timeout=60
    )
    assert proc.returncode == 0, f"iptables {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def forward_policy() -> str:
    for line in iptables("-S", "FORWARD").splitlines():
        words = line.split()
        if words[:2] == ["-P", "FORWARD"]:
            return words[2]
    raise AssertionError("iptables -S FORWARD lists no policy")


def accepted_packets(bridge: str) -> int:
    """The packet counter of the cluster's rule: what it has let through FORWARD."""
    for line in iptables("-v", "-S", "FORWARD").splitlines():
        words = shlex.split(line)
        if firewall.tag(bridge) in words and "-c" in words:
            return int(words[words.index("-c") + 1])
    raise AssertionError(f"no FORWARD rule for {bridge}")


@contextlib.contextmanager
def docker_forwarding() -> Iterator[None]:
    """Set what Docker's start-up sets (FORWARD DROP, bridge netfilter on) and restore it after.

    SIGTERM is turned into an exception meanwhile, so a test run that is terminated still
    restores the machine's settings; each setting is restored even if another could not be.
    """
    loaded = False
    if not BRIDGE_NF.exists():
        subprocess.run(["modprobe", "br_netfilter"], check=True, capture_output=True)
        loaded = True
    policy, bridge_nf = forward_policy(), BRIDGE_NF.read_text().strip()

    def terminated(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous_handler = signal.signal(signal.SIGTERM, terminated)
    try:
        BRIDGE_NF.write_text("1")
        iptables("-P", "FORWARD", "DROP")
        yield
    finally:
        try:
            iptables("-P", "FORWARD", policy)
        finally:
            try:
                BRIDGE_NF.write_text(bridge_nf)
            finally:
                if loaded:
                    subprocess.run(["modprobe", "-r", "br_netfilter"], check=False)
                signal.signal(signal.SIGTERM, previous_handler)
        assert (forward_policy(), BRIDGE_NF.read_text().strip()) == (policy, bridge_nf)


def connects(ns: str, address: str, timeout: float) -> bool:
    argv = ["ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, address, str(timeout)]
    return subprocess.run(argv, capture_output=True, check=False, timeout=30).returncode == 0


@pytest.fixture
def two_pods() -> Iterator[tuple[network.ClusterNetwork, str, str]]:
    """A cluster's bridge with two pod namespaces: a client and a server on port 7000."""
    net = network.choose_network(f"forward-policy-test-{uuid.uuid4().hex}")
    server: subprocess.Popen[str] | None = None
    try:
        network.create_bridge(net)
        client = network.create_pod_network(net, "client", net.pod_address(1))
        server_ns = network.create_pod_network(net, "server", net.pod_address(2))
        server = subprocess.Popen(
            ["ip", "netns", "exec", server_ns, sys.executable, "-c", SERVE],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        yield net, client, net.pod_address(2)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        network.cleanup_cluster(net)
    assert firewall.bridge_rules(net.bridge) == []


def test_pods_on_the_bridge_pass_a_drop_policy_through_the_clusters_rule_alone(
    two_pods: tuple[network.ClusterNetwork, str, str],
) -> None:
    net, client, server = two_pods
    assert len(firewall.bridge_rules(net.bridge)) == 1
    with docker_forwarding():
        reached = connects(client, server, timeout=3)
        # Without the rule the same connection is dropped: the setting does what Docker's does.
        firewall.remove_bridge(net.bridge)
        dropped = not connects(client, server, timeout=1)
        network.create_bridge(net)  # what `up` and the agent's start call: the rule is back
        reached_again = connects(client, server, timeout=3)
    assert (reached, dropped, reached_again) == (True, True, True)
    assert len(firewall.bridge_rules(net.bridge)) == 1


@pytest.mark.cluster
@pytest.mark.trainer
def test_a_two_host_job_trains_to_the_end_with_forward_dropped_and_bridge_netfilter_on(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    state = controlplane.ClusterState.load(cluster.state_dir)
    assert state is not None
    bridge = state.network.bridge
    assert len(firewall.bridge_rules(bridge)) == 1
    before = accepted_packets(bridge)
    # Two hosts: the second process joins the coordinator in the first one's pod, across the
    # bridge, which is where a dropped FORWARD chain hangs `jax.distributed` start-up.
    with docker_forwarding():
        run = Run(cluster, namespace, operator, training_job("docker", tmp_path, steps=20))
        status = run.wait_phase("Succeeded", timeout=240)
    assert status["restarts"]["total"] == 0, status.get("lastFailure")
    assert status["progress"]["step"] == 20
    # The workers' traffic went through FORWARD, and the cluster's rule let it through.
    assert accepted_packets(bridge) > before
