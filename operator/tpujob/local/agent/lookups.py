"""What pods need from the API server at start: ConfigMaps, Secrets and bound tokens."""

from __future__ import annotations

import base64
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException


class ApiLookups:
    """`sandbox.Lookups` over the Kubernetes API, as the node agent's identity."""

    def __init__(self, core: client.CoreV1Api, ca_path: Path) -> None:
        self.core = core
        self.ca_path = ca_path

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            return dict(self.core.read_namespaced_config_map(name, namespace).data or {})
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            data = self.core.read_namespaced_secret(name, namespace).data or {}
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}

    def token(
        self,
        namespace: str,
        service_account: str,
        *,
        pod: str,
        pod_uid: str,
        audiences: list[str],
        seconds: int,
    ) -> str:
        spec: dict[str, object] = {
            "expirationSeconds": max(600, seconds),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": pod_uid},
        }
        if audiences:
            spec["audiences"] = audiences
        result = self.core.create_namespaced_service_account_token(
            service_account, namespace, {"spec": spec}
        )
        return str(result.status.token)

    def ca_cert(self) -> str:
        return self.ca_path.read_text()
