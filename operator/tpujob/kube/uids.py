"""The uids of what exists now: metadata-only lists, page by page, for the ghost check.

A list of full pods of a large cluster is megabytes the operator would parse only to keep the
uids; asking for `PartialObjectMetadataList` brings each object's metadata alone (the apiserver
converts), and pages of `PAGE` keep each answer small.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from kubernetes import client

from tpujob.api import GROUP, PLURAL, VERSION, labels
from tpujob.kube.errors import call

PAGE = 500
METADATA_ONLY = {
    "Accept": "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
}


def _uids(list_page: Callable[..., Any]) -> frozenset[str]:
    found: set[str] = set()
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": PAGE, "_preload_content": False}
        if token:
            kwargs["_continue"] = token
        answer = call(list_page, _headers=METADATA_ONLY, **kwargs)
        page = json.loads(answer.data)
        found.update(
            str(uid)
            for item in page.get("items") or ()
            if (uid := (item.get("metadata") or {}).get("uid"))
        )
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return frozenset(found)


def _in(
    namespaces: Iterable[str], everywhere: Callable[..., Any], one: Callable[..., Any]
) -> frozenset[str]:
    """The uids `everywhere` lists, or, given namespaces, those `one(namespace)` lists in each."""
    spaces = tuple(namespaces)
    if not spaces:
        return _uids(everywhere)
    return frozenset().union(*(_uids(partial(one, ns)) for ns in spaces))


def pod_uids(api: client.ApiClient, namespaces: Iterable[str] = ()) -> frozenset[str]:
    """Uids of the pods that name a job (`labels.JOB`): in `namespaces`, or in all."""
    core = client.CoreV1Api(api)
    return _in(
        namespaces,
        partial(core.list_pod_for_all_namespaces, label_selector=labels.JOB),
        partial(core.list_namespaced_pod, label_selector=labels.JOB),
    )


def node_uids(api: client.ApiClient) -> frozenset[str]:
    core = client.CoreV1Api(api)
    return _uids(core.list_node)


def job_uids(api: client.ApiClient, namespaces: Iterable[str] = ()) -> frozenset[str]:
    """Uids of the TPUTrainingJobs: in `namespaces`, or in all."""
    custom = client.CustomObjectsApi(api)
    return _in(
        namespaces,
        partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL),
        lambda ns, **kw: custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kw),
    )
