"""The local cluster's pod network keeps the gateway reachable while other pods come and go.

Real network namespaces, veth pairs and a bridge (what the node agent makes), no cluster.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpujob.local import network

CONNECT = (
    "import socket, sys\n"
    "socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
)


@pytest.fixture
def pod_net() -> Iterator[network.ClusterNetwork]:
    net = network.choose_network(f"pod-network-test-{uuid.uuid4().hex}")
    network.create_bridge(net)
    try:
        yield net
    finally:
        network.cleanup_cluster(net)


def bridge_address(net: network.ClusterNetwork) -> str:
    return Path(f"/sys/class/net/{net.bridge}/address").read_text().strip()


def connects_to_gateway(net: network.ClusterNetwork, ns: str, port: int) -> bool:
    proc = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, net.gateway, str(port)],
        capture_output=True,
        check=False,
        timeout=20,
    )
    return proc.returncode == 0


def test_a_pod_still_reaches_the_gateway_after_another_pods_network_goes(
    pod_net: network.ClusterNetwork,
) -> None:
    with socket.create_server((pod_net.gateway, 0)) as server:
        server.listen(16)
        port = server.getsockname()[1]
        network.create_pod_network(pod_net, "leaving", pod_net.pod_address(1))
        # The lowest MAC a port can have: a bridge without an address of its own takes it when
        # the port joins, and takes another when it leaves.
        leaving = pod_net.host_veth("leaving")
        network.run_ip(["link", "set", leaving, "nomaster"])
        network.run_ip(["link", "set", leaving, "address", "02:00:00:00:00:01"])
        network.run_ip(["link", "set", leaving, "master", pod_net.bridge])
        staying = network.create_pod_network(pod_net, "staying", pod_net.pod_address(2))
        assert connects_to_gateway(pod_net, staying, port)  # its ARP entry for the gateway
        before = bridge_address(pod_net)
        network.delete_pod_network(pod_net, "leaving")
        assert bridge_address(pod_net) == before == network.bridge_mac(pod_net.bridge)
        assert connects_to_gateway(pod_net, staying, port)
