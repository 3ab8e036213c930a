"""Creates through the client, over real HTTP on loopback: the answer is left unparsed, yet its
connection goes back to the pool, and an object that exists is no error."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from tpujob.kube.apply import ApiWriter


class Apiserver:
    """Answers every POST 201 with the object (or 409 for names in `existing`), keeping
    connections alive, and counts the connections opened to it."""

    def __init__(self) -> None:
        self.connections = 0
        self.created: list[str] = []
        self.existing = {"taken"}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                outer.connections += 1
                super().setup()

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                name = body["metadata"]["name"]
                status = 409 if name in outer.existing else 201
                if status == 201:
                    outer.created.append(name)
                data = json.dumps(body if status == 201 else {"kind": "Status", "code": 409})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data.encode())

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)


@pytest.fixture()
def apiserver() -> Iterator[tuple[Apiserver, ApiWriter]]:
    served = Apiserver()
    thread = threading.Thread(target=served.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{served.server.server_address[1]}"
    cfg.connection_pool_maxsize = 1
    try:
        yield served, ApiWriter(client.ApiClient(cfg))
    finally:
        served.server.shutdown()
        served.server.server_close()


def pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


def test_creates_reuse_one_connection_and_an_existing_object_is_no_error(
    apiserver: tuple[Apiserver, ApiWriter],
) -> None:
    served, writer = apiserver
    made = [writer.create(pod(f"p{i}")) for i in range(10)]
    assert made == [True] * 10
    assert writer.create(pod("taken")) is False
    assert writer.create(pod("after")) is True
    assert served.created == [f"p{i}" for i in range(10)] + ["after"]
    # Each answer was read off and its connection given back: one connection for them all.
    assert served.connections == 1
