"""A stand-in apiserver on loopback for the CLI's tests: fixed objects by path, every request
recorded, and kubeconfig files that point at it (or at nothing).

The CLI is driven whole (argparse, kubeconfig, the real client, the output), so what a test
asserts is what a person would see."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from tests.unit.json_server import serve_json

JOBS = "/apis/tpujob.dev/v1alpha1"


def jobs_path(namespace: str | None = None, name: str | None = None) -> str:
    """The API path of the jobs of `namespace` (every namespace without), or of one job."""
    path = (
        f"{JOBS}/namespaces/{namespace}/tputrainingjobs" if namespace else f"{JOBS}/tputrainingjobs"
    )
    return f"{path}/{name}" if name else path


def job_list(*jobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "tpujob.dev/v1alpha1",
        "kind": "TPUTrainingJobList",
        "metadata": {"resourceVersion": "7"},
        "items": list(jobs),
    }


def not_found(path: str) -> dict[str, Any]:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": f'tputrainingjobs.tpujob.dev "{name}" not found',
        "reason": "NotFound",
        "code": 404,
    }


@dataclass
class FakeApiserver:
    """Answers GETs from `routes` (path -> object), 404 with a Status otherwise."""

    routes: dict[str, Any] = field(default_factory=dict)
    requested: list[str] = field(default_factory=list)
    url: str = ""

    def answer(self, raw: str) -> tuple[int, Any]:
        path = urlsplit(raw).path
        self.requested.append(path)
        found = self.routes.get(path)
        return (200, found) if found is not None else (404, not_found(path))


@contextmanager
def running_apiserver() -> Iterator[FakeApiserver]:
    fake = FakeApiserver()
    with serve_json(fake.answer) as url:
        fake.url = url
        yield fake


def closed_port() -> int:
    """A loopback port nothing listens on: bound, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_kubeconfig(
    path: Path, server: str, contexts: dict[str, str | None], current: str
) -> Path:
    """A kubeconfig with one cluster at `server` and a context per name, each with its
    namespace (None: no namespace)."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {
                "name": name,
                "context": {"cluster": "c", "user": "u"}
                | ({"namespace": ns} if ns is not None else {}),
            }
            for name, ns in contexts.items()
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(document))
    return path
