"""Building the API client once per process, from in-cluster credentials or a kubeconfig."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kubernetes import client, config


def api_client(
    kubeconfig: str | None = None,
    on_request: Callable[[str], None] | None = None,
    connections: int | None = None,
) -> client.ApiClient:
    """In a pod: the ServiceAccount; otherwise `kubeconfig` or $KUBECONFIG.

    `on_request` is told the HTTP verb of every request sent (the operator counts them).
    `connections`: how many connections to keep open; at least as many as threads that call
    at once, or each call beyond it opens (and TLS-handshakes) a connection of its own and
    throws it away (the client's default is five per CPU).
    """
    cfg = client.Configuration()
    if (
        kubeconfig is None
        and os.environ.get("KUBERNETES_SERVICE_HOST")
        and not os.environ.get("KUBECONFIG")
    ):
        config.load_incluster_config(client_configuration=cfg)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    if connections is not None:
        cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, connections)
    api = client.ApiClient(cfg)
    if on_request is not None:
        _count_requests(api, on_request)
    return api


def _count_requests(api: client.ApiClient, on_request: Callable[[str], None]) -> None:
    rest = api.rest_client
    send = rest.request

    def counted(method: str, *args: Any, **kwargs: Any) -> Any:
        on_request(method)
        return send(method, *args, **kwargs)

    rest.request = counted
