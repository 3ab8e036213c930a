"""Building the API client once per process, from in-cluster credentials or a kubeconfig."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client, config

# Where a pod's ServiceAccount token says which namespace the pod runs in.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _in_cluster(kubeconfig: str | None, context: str | None) -> bool:
    """In a pod, unless a kubeconfig or one of its contexts was asked for."""
    return (
        kubeconfig is None
        and context is None
        and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        and not os.environ.get("KUBECONFIG")
    )


def api_client(
    kubeconfig: str | None = None,
    on_request: Callable[[str], None] | None = None,
    connections: int | None = None,
    context: str | None = None,
) -> client.ApiClient:
    """In a pod: the ServiceAccount; otherwise `kubeconfig` or $KUBECONFIG, at `context` (by
    default the current context).

    `on_request` is told the HTTP verb of every request sent (the operator counts them).
    `connections`: how many connections to keep open; at least as many as threads that call
    at once, or each call beyond it opens (and TLS-handshakes) a connection of its own and
    throws it away (the client's default is five per CPU).
    """
    cfg = client.Configuration()
    if _in_cluster(kubeconfig, context):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    if connections is not None:
        cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, connections)
    api = client.ApiClient(cfg)
    if on_request is not None:
        _count_requests(api, on_request)
    return api


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> str:
    """The namespace a command means when it names none, as kubectl reads it: the context's
    (in a pod, the pod's own), else `default`."""
    if _in_cluster(kubeconfig, context):
        try:
            return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or "default"
        except OSError:
            return "default"
    contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
    chosen = (
        current if context is None else next((c for c in contexts if c["name"] == context), None)
    )
    if chosen is None:
        raise config.ConfigException(f"no context {context!r} in the kubeconfig")
    return str((chosen.get("context") or {}).get("namespace") or "default")


def _count_requests(api: client.ApiClient, on_request: Callable[[str], None]) -> None:
    rest = api.rest_client
    send = rest.request

    def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        on_request(method)
        return send(method, *args, **kwargs)

    rest.request = counted
