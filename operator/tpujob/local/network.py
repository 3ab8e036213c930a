"""Pod networking for the local cluster: one bridge per cluster, one network namespace per pod.

Every pod gets its own network namespace with a veth pair into the cluster's bridge and an
address from the cluster's private /16, as a pod on GKE gets its own IP: two jobs can both
listen on the JAX coordinator port. The bridge holds the gateway address, where the node agent
forwards the Kubernetes API; traffic never leaves namespaces the cluster made. The bridge's own
traffic is let through the host's FORWARD chain whatever its policy (`firewall`), which Docker
sets to DROP.
"""

from __future__ import annotations

import hashlib
import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from tpujob.local import firewall


class NetworkError(RuntimeError):
    """An `ip` command failed; the message names it."""


def run_ip(args: Sequence[str], *, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def short_id(*parts: str, length: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


@dataclass(frozen=True)
class ClusterNetwork:
    """The cluster's bridge and pod range."""

    bridge: str
    subnet: str  # e.g. 10.123.0.0/16

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def gateway(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def prefix(self) -> int:
        return self.network.prefixlen

    def pod_address(self, index: int) -> str:
        """The index-th pod address (from .1.1 upward, leaving .0.x to the gateway)."""
        return str(self.network.network_address + 256 + index)

    def netns_name(self, pod_uid: str) -> str:
        return f"tpj-{self.bridge[3:]}-{pod_uid[:13]}"

    def host_veth(self, pod_uid: str) -> str:
        return f"tv{short_id(self.bridge, pod_uid, length=11)}"


def used_subnets() -> set[ipaddress.IPv4Network]:
    nets: set[ipaddress.IPv4Network] = set()
    for line in run_ip(["-o", "-4", "addr", "show"]).splitlines():
        fields = line.split()
        if "inet" in fields:
            nets.add(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    return nets


def choose_network(cluster_key: str) -> ClusterNetwork:
    """A bridge name and a free 10.x.0.0/16 for the cluster identified by `cluster_key`."""
    bridge = f"tpj{short_id(cluster_key, length=8)}"
    used = used_subnets()
    start = int(short_id(cluster_key, length=4), 16) % 100
    for offset in range(100):
        candidate = ipaddress.IPv4Network(f"10.{100 + (start + offset) % 100}.0.0/16")
        if not any(candidate.overlaps(u) for u in used):
            return ClusterNetwork(bridge, str(candidate))
    raise NetworkError("no free 10.x.0.0/16 range for the pod network")


def bridge_mac(bridge: str) -> str:
    """A fixed, locally administered unicast MAC for the bridge, derived from its name.

    A Linux bridge without an address of its own takes the lowest MAC among its ports, so it
    changes whenever a pod's veth joins or leaves. Every pod's ARP entry for the gateway then
    points at a MAC nobody answers to, and its connections to the API (heartbeats, fencing
    reads) time out until the entry goes stale, about half a minute: long enough for the
    operator to see a hang that never happened.
    """
    digest = short_id("bridge-mac", bridge, length=10)
    return ":".join(["02", *(digest[i : i + 2] for i in range(0, 10, 2))])


def create_bridge(net: ClusterNetwork) -> None:
    """Create the bridge with the gateway address (if missing) and let its traffic through."""
    if not run_ip(["link", "show", net.bridge], check=False):
        run_ip(["link", "add", net.bridge, "address", bridge_mac(net.bridge), "type", "bridge"])
        run_ip(["addr", "add", f"{net.gateway}/{net.prefix}", "dev", net.bridge])
        run_ip(["link", "set", net.bridge, "up"])
    # After the bridge exists: a rule whose bridge does not exist is taken for a leftover.
    firewall.allow_bridge(net.bridge)


def delete_bridge(net: ClusterNetwork) -> None:
    firewall.remove_bridge(net.bridge)
    run_ip(["link", "del", net.bridge], check=False)


def create_pod_network(net: ClusterNetwork, pod_uid: str, address: str) -> str:
    """Create the pod's namespace wired to the bridge; returns the namespace name."""
    ns, host = net.netns_name(pod_uid), net.host_veth(pod_uid)
    delete_pod_network(net, pod_uid)
    peer = f"tp{host[2:]}"
    run_ip(["netns", "add", ns])
    run_ip(["link", "add", host, "type", "veth", "peer", "name", peer])
    run_ip(["link", "set", peer, "netns", ns])
    run_ip(["link", "set", host, "master", net.bridge, "up"])
    run_ip(["-n", ns, "link", "set", peer, "name", "eth0"])
    run_ip(["-n", ns, "addr", "add", f"{address}/{net.prefix}", "dev", "eth0"])
    run_ip(["-n", ns, "link", "set", "eth0", "up"])
    run_ip(["-n", ns, "link", "set", "lo", "up"])
    run_ip(["-n", ns, "route", "add", "default", "via", net.gateway])
    return ns


def delete_pod_network(net: ClusterNetwork, pod_uid: str) -> None:
    # Deleting the namespace removes the veth pair with it.
    run_ip(["netns", "del", net.netns_name(pod_uid)], check=False)
    run_ip(["link", "del", net.host_veth(pod_uid)], check=False)


def set_pod_link(net: ClusterNetwork, pod_uid: str, *, up: bool) -> None:
    """Cut (or restore) a pod's network while its processes live on."""
    run_ip(["link", "set", net.host_veth(pod_uid), "up" if up else "down"])


def cleanup_cluster(net: ClusterNetwork) -> None:
    """Remove every namespace, link and FORWARD rule this cluster made."""
    prefix = f"tpj-{net.bridge[3:]}-"
    for line in run_ip(["netns", "list"], check=False).splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix):
            run_ip(["netns", "del", name], check=False)
    delete_bridge(net)
