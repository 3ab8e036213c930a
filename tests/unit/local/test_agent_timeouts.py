"""The node agent's API calls end when an apiserver accepts a request and never answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3
from kubernetes import client

from tpujob.local.agent import agent


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server that accepts connections and never sends a byte (a wedged apiserver)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    done.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def _kubeconfig(tmp_path: Path, port: int) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
"""
    )
    return str(path)


@pytest.mark.timeout(60)  # without a read timeout the first row would block for good
@pytest.mark.parametrize(
    ("default", "named"),
    [
        pytest.param((1.0, 1.0), None, id="no-timeout-named-gets-the-default"),
        pytest.param((1.0, 600.0), (1.0, 1.0), id="a-named-timeout-is-kept"),
    ],
)
def test_a_call_to_a_silent_apiserver_times_out_instead_of_blocking_for_good(
    tmp_path: Path,
    silent_server: int,
    monkeypatch: pytest.MonkeyPatch,
    default: tuple[float, float],
    named: tuple[float, float] | None,
) -> None:
    monkeypatch.setattr(agent, "REQUEST_TIMEOUT", default)
    api = client.CoreV1Api(agent.timed_client(_kubeconfig(tmp_path, silent_server)))
    api.api_client.rest_client.pool_manager.connection_pool_kw["retries"] = False
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        api.list_pod_for_all_namespaces(_request_timeout=named)
    assert time.monotonic() - started < 30
