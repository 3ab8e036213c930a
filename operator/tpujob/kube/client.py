"""Building the API client once per process, from in-cluster credentials or a kubeconfig."""

from __future__ import annotations

import os

from kubernetes import client, config


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    """In a pod: the ServiceAccount; otherwise `kubeconfig` or $KUBECONFIG."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST") and \
            not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig)
