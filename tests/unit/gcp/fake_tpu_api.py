"""A local stand-in for the Cloud TPU API's acceleratorTypes list, served over real HTTP.

Zones map to pages of accelerator types (JSON as the v2 REST API returns them) or to an HTTP
status the zone answers with; every request is recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.unit.json_server import serve_json


def accelerator_type(zone: str, name: str, generation: str, topology: str) -> dict[str, Any]:
    return {
        "name": f"projects/p/locations/{zone}/acceleratorTypes/{name}",
        "type": name,
        "acceleratorConfigs": [{"type": generation, "topology": topology}],
    }


@dataclass
class FakeTpuApi:
    # zone -> pages of acceleratorTypes, or an HTTP status code for every request
    zones: Mapping[str, list[list[dict[str, Any]]] | int]
    requests: list[str] = field(default_factory=list)

    def answer(self, path: str, query: Mapping[str, list[str]]) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        # v2/projects/{project}/locations/{zone}/acceleratorTypes
        if len(parts) != 6 or parts[0] != "v2" or parts[5] != "acceleratorTypes":
            return 404, {"error": {"code": 404, "message": "no such method", "status": "NOT_FOUND"}}
        zone = parts[4]
        found = self.zones.get(zone, 404)
        if isinstance(found, int):
            status = {403: "PERMISSION_DENIED", 404: "NOT_FOUND"}.get(found, "INTERNAL")
            return found, {
                "error": {"code": found, "message": f"zone {zone}: {status}", "status": status}
            }
        page = int((query.get("pageToken") or ["0"])[0] or 0)
        body: dict[str, Any] = {"acceleratorTypes": found[page]}
        if page + 1 < len(found):
            body["nextPageToken"] = str(page + 1)
        return 200, body


def serve(api: FakeTpuApi) -> AbstractContextManager[str]:
    """Run `api` on a free local port; yields its endpoint (http://127.0.0.1:PORT)."""

    def answer(raw: str) -> tuple[int, dict[str, Any]]:
        api.requests.append(raw)
        url = urlparse(raw)
        return api.answer(url.path, parse_qs(url.query))

    return serve_json(answer)
