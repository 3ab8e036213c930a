"""The node agent's pod address pool: an address is freed once, and only by its own pod."""

from __future__ import annotations

from pathlib import Path

from tpujob.local import network
from tpujob.local.agent import podrunner, sandbox
from tpujob.local.agent.runtime import PodRuntime


def runner(tmp_path: Path) -> podrunner.PodRunner:
    net = network.ClusterNetwork(bridge="unused", subnet="10.123.0.0/16")
    return podrunner.PodRunner(
        tmp_path / "agent", net, sandbox.ApiEndpoint("127.0.0.1", 1), NoLookups()
    )


class NoLookups:
    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return None


def finished_pod(tmp_path: Path, name: str, index: int) -> PodRuntime:
    # netns "" is a pod whose sandbox is already gone, so no network call is made.
    return PodRuntime(
        uid=name, namespace="ns", name=name, node="n", directory=tmp_path / name, ip_index=index
    )


def test_removing_a_finished_pod_does_not_free_an_address_a_newer_pod_holds(tmp_path: Path) -> None:
    pool = runner(tmp_path)
    old = finished_pod(tmp_path, "old", pool._allocate())
    pool.release_network(old)  # the old pod's containers all ended
    newer = pool._allocate()  # a new pod takes the freed address
    assert newer == 1
    pool.remove(old)  # the old pod is deleted from the API later
    assert pool._allocate() != newer


def test_a_released_address_is_reused(tmp_path: Path) -> None:
    pool = runner(tmp_path)
    first = finished_pod(tmp_path, "a", pool._allocate())
    pool.release_network(first)
    assert pool._allocate() == 1
