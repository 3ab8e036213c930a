"""A local HTTP server that answers GETs with JSON, for the fakes of the APIs the code calls
(the Cloud TPU API, the Kubernetes apiserver), served over real HTTP on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The request's path (with its query) -> the status and the JSON body to answer with.
Answer = Callable[[str], tuple[int, Any]]


@contextmanager
def serve_json(answer: Answer) -> Iterator[str]:
    """Run `answer` on a free loopback port; yields its endpoint (http://127.0.0.1:PORT)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return  # pytest shows stderr on failure: keep it to what the code printed

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    # A short poll, so that shutting down does not wait half a second a test.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
