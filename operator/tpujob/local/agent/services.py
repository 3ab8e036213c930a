"""Small servers the agent runs beside the pods.

* `ApiForwarder`: forwards TCP from the pod network's gateway to the API server on loopback,
  so in-cluster clients reach it at KUBERNETES_SERVICE_HOST/PORT as in a real cluster.
* `LogServer`: the part of the kubelet API the API server calls for `kubectl logs`
  (`/containerLogs/NS/POD/CONTAINER`), over TLS with a certificate from the cluster CA.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path


class ApiForwarder:
    """A TCP forwarder from `listen` to 127.0.0.1:`target_port`, in its own thread."""

    def __init__(self, listen_host: str, listen_port: int, target_port: int) -> None:
        self.listen = (listen_host, listen_port)
        self.target_port = target_port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="api-forwarder", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, *self.listen, reuse_address=True)
            )
        except OSError as err:
            self._error = err
            self._ready.set()
            return
        self._ready.set()
        with contextlib.closing(server):
            self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


class LogServer:
    """Serves container logs to the API server; `find_log(ns, pod, container)` locates them."""

    def __init__(
        self,
        cert: Path,
        key: Path,
        ca: Path,
        find_log: Callable[[str, str, str, bool], Path | None],
    ) -> None:
        handler = self._handler(find_log)
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.load_verify_locations(ca)
        ctx.verify_mode = ssl.CERT_REQUIRED  # only the API server's client certificate
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])

    def start(self) -> None:
        threading.Thread(target=self.httpd.serve_forever, name="log-server", daemon=True).start()

    @staticmethod
    def _handler(
        find_log: Callable[[str, str, str, bool], Path | None],
    ) -> type[http.server.BaseHTTPRequestHandler]:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                parts = url.path.strip("/").split("/")
                query = urllib.parse.parse_qs(url.query)
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404)
                    return
                previous = query.get("previous", ["false"])[0] == "true"
                path = find_log(parts[1], parts[2], parts[3], previous)
                if path is None or not path.exists():
                    self.send_error(404, "no such container log")
                    return
                data = path.read_bytes()
                if "tailLines" in query:
                    lines = data.splitlines(keepends=True)
                    data = b"".join(lines[-int(query["tailLines"][0]) :])
                if "limitBytes" in query:
                    data = data[: int(query["limitBytes"][0])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                return

        return Handler
