"""Carry out a Plan: write the status once, then create, delete, mark, and tell.

Every verb is idempotent: creating what exists, deleting what is gone, tainting a tainted
node are no-ops. The status is written with the resourceVersion the plan was made from, so a
concurrent change shows as a ConflictError and the reconcile is redone on fresh data.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes import client

from tpujob.api import GROUP, PLURAL, VERSION, BadNodeAction, contract, labels
from tpujob.kube.errors import ConflictError, KubeError, NotFoundError, call
from tpujob.plan.result import EventSpec, NodeMark, PodDeletion, PodRejoin

EVENT_MESSAGE_LIMIT = 1024
MERGE_PATCH = "application/merge-patch+json"
COMPONENT = "tpujob-operator"


# Reads and patches of one node mark before a reconcile gives up on it for now.
MARK_TRIES = 3


class Writer(Protocol):
    """What the controller does to the cluster: the verbs a plan is carried out with.

    `ApiWriter` is the one the operator runs; tests record the calls instead. Every verb is
    blocking (the controller runs it in its executor) and idempotent.
    """

    def write_status(self, body: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]: ...
    def create(self, obj: dict[str, Any]) -> bool: ...
    def pod_owner_uids(self, namespace: str, name: str) -> frozenset[str]: ...
    def fence(self, lease: dict[str, Any], attempt: int) -> None: ...
    def delete_pod(self, namespace: str, deletion: PodDeletion) -> None: ...
    def rejoin_pod(self, namespace: str, rejoin: PodRejoin) -> None: ...
    def mark_node(self, mark: NodeMark, job: str) -> None: ...
    def event(self, body: Mapping[str, Any], spec: EventSpec) -> bool: ...
    def bind_cluster_role(
        self, namespace: str, name: str, role: str, account: str, account_namespace: str
    ) -> None: ...
    def save_config(self, namespace: str, name: str, data: dict[str, str]) -> None: ...
    def delete_job(self, body: Mapping[str, Any]) -> None: ...


class ApiWriter:
    """`Writer` through the Kubernetes API."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.serialize = api.sanitize_for_serialization

    def write_status(self, body: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Replace the status subresource; ConflictError if the job changed since it was read."""
        meta = body["metadata"]
        new = {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta["resourceVersion"],
            },
            "spec": body.get("spec", {}),
            "status": status,
        }
        return dict(
            call(
                self.custom.replace_namespaced_custom_object_status,
                GROUP,
                VERSION,
                meta["namespace"],
                PLURAL,
                meta["name"],
                new,
            )
        )

    def _creator(self, kind: str) -> Callable[..., Any]:
        creators: dict[str, Callable[..., Any]] = {
            "Pod": self.core.create_namespaced_pod,
            "Service": self.core.create_namespaced_service,
            "ServiceAccount": self.core.create_namespaced_service_account,
            "Role": self.rbac.create_namespaced_role,
            "RoleBinding": self.rbac.create_namespaced_role_binding,
            "Lease": self.coordination.create_namespaced_lease,
        }
        return creators[kind]

    def create(self, obj: dict[str, Any]) -> bool:
        """Create `obj` unless it exists; True when it was created."""
        try:
            # The created object is not read: left unparsed (a pod's answer made into the
            # client's models cost more than the request), read off and its connection freed.
            answer = call(
                self._creator(obj["kind"]),
                obj["metadata"]["namespace"],
                obj,
                _preload_content=False,
            )
        except ConflictError:
            return False
        answer.read()
        answer.release_conn()
        return True

    def pod_owner_uids(self, namespace: str, name: str) -> frozenset[str]:
        """The ownerReference uids of an existing pod (empty when it has none or is gone)."""
        try:
            found = call(self.core.read_namespaced_pod, name, namespace)
        except NotFoundError:
            return frozenset()
        return frozenset(str(r.uid) for r in found.metadata.owner_references or [])

    def fence(self, lease: dict[str, Any], attempt: int) -> None:
        """Write `attempt` as the fencing token on the heartbeat Lease (creating it if needed).

        Trainers read the token before committing a checkpoint and stop when a newer attempt
        holds it, so a worker that only looks dead (a partitioned or NotReady node) cannot
        overwrite the checkpoints the next attempt restores from. The token only moves forward:
        a stale reconcile cannot hand the checkpoints back to an older attempt.
        """
        meta = lease["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        ours = {r["uid"] for r in meta.get("ownerReferences") or []}
        # The token counts this job's attempts: the job's uid goes with it, so a trainer left
        # over from an earlier job of the same name cannot read it as its own.
        token = {contract.LEASE_FENCE_ANNOTATION: str(attempt)}
        if ours:
            token[contract.LEASE_FENCE_JOB_ANNOTATION] = min(ours)
        body = {
            **lease,
            "metadata": {**meta, "annotations": {**(meta.get("annotations") or {}), **token}},
        }
        if attempt == 1:
            # A job's first attempt almost always makes its Lease: made with the token, a
            # launch spends one request on it, not a read that finds nothing and then a create.
            with contextlib.suppress(ConflictError):  # left by an earlier job of the name
                call(self.coordination.create_namespaced_lease, namespace, body)
                return
        try:
            current = call(self.coordination.read_namespaced_lease, name, namespace)
        except NotFoundError:
            call(self.coordination.create_namespaced_lease, namespace, body)
            return
        notes = current.metadata.annotations or {}
        held = notes.get(contract.LEASE_FENCE_ANNOTATION, "")
        theirs = {r.uid for r in current.metadata.owner_references or []}
        patch: dict[str, Any] = {
            "annotations": token,
            "resourceVersion": current.metadata.resource_version,
        }
        if not ours & theirs:
            # A Lease left by an earlier job of the same name, not yet garbage-collected (or
            # orphaned): its token counts that job's attempts and its heartbeat that job's
            # steps. Take it over, token and owner both, and clear the old heartbeat.
            patch["ownerReferences"] = meta.get("ownerReferences")
            stale = {k: None for k in notes if k not in token}
            patch["annotations"] = {**stale, **token}
        elif held.isdigit() and int(held) >= attempt:
            # Never back: a stale reconcile leaves the newer token, and only names the job
            # where a Lease written before the uid went with the token lacks it.
            named = {k: v for k, v in token.items() if k != contract.LEASE_FENCE_ANNOTATION}
            if all(notes.get(k) == v for k, v in named.items()):
                return
            patch["annotations"] = named
        # The resourceVersion makes a concurrent fence from another replica a Conflict.
        call(
            self.coordination.patch_namespaced_lease,
            name,
            namespace,
            {"metadata": patch},
            _content_type=MERGE_PATCH,
        )

    def delete_pod(self, namespace: str, deletion: PodDeletion) -> None:
        options = client.V1DeleteOptions(
            grace_period_seconds=deletion.grace_seconds,
            preconditions=client.V1Preconditions(uid=deletion.uid),
        )
        # Gone already, or a new pod took the name: nothing to do either way.
        with contextlib.suppress(NotFoundError, ConflictError):
            call(self.core.delete_namespaced_pod, deletion.name, namespace, body=options)

    def rejoin_pod(self, namespace: str, rejoin: PodRejoin) -> None:
        """Move a kept pod to the new attempt: its attempt label, and the rejoin order its
        trainer's supervisor reads through the pod's downward-API volume."""
        patch = {
            "metadata": {
                "uid": rejoin.uid,  # a pod made since under the name is not this one: Conflict
                "labels": {labels.ATTEMPT: str(rejoin.attempt)},
                "annotations": {contract.POD_REJOIN_ANNOTATION: rejoin.order},
            }
        }
        # Gone, or another pod by now: the next reconcile sees it missing or ended.
        with contextlib.suppress(NotFoundError, ConflictError):
            call(
                self.core.patch_namespaced_pod,
                rejoin.name,
                namespace,
                patch,
                _content_type=MERGE_PATCH,
            )

    def mark_node(self, mark: NodeMark, job: str) -> None:
        if mark.action is BadNodeAction.NONE:
            return
        for tries_left in reversed(range(MARK_TRIES)):
            try:
                node = call(self.core.read_node, mark.node)
            except NotFoundError:
                return  # the node was deleted: nothing left to mark, and other marks still follow
            if mark.clear:
                self._clear_mark(node, mark)
                return
            try:
                self._add_mark(node, mark, job)
                return
            except NotFoundError:
                return
            except ConflictError:
                # Changed between the read and the patch (a taint added by someone else, which
                # the whole-list patch would drop): read it again. Past the tries, the reconcile
                # fails and the journaled mark is made by the next one.
                if not tries_left:
                    raise

    def _add_mark(self, node: Any, mark: NodeMark, job: str) -> None:
        """Mark the Node as read now; the patch carries its resourceVersion (taints are one
        list, written whole)."""
        patch: dict[str, Any] = {
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {labels.BAD_NODE_REASON: mark.reason[:256]},
            }
        }
        if mark.action is BadNodeAction.CORDON:
            patch["spec"] = {"unschedulable": True}
        else:
            taints = [self.serialize(t) for t in node.spec.taints or []]
            if any(t.get("key") == labels.BAD_NODE_TAINT for t in taints):
                return
            taints.append({"key": labels.BAD_NODE_TAINT, "value": job[:63], "effect": "NoSchedule"})
            patch["spec"] = {"taints": taints}
        call(self.core.patch_node, mark.node, patch, _content_type=MERGE_PATCH)

    def _clear_mark(self, node: Any, mark: NodeMark) -> None:
        """Take off the mark only if it is still the one `mark.reason` names, on the Node as
        read now: the patch carries its resourceVersion, so a mark made by someone else in
        between makes it a Conflict, and the next reconcile looks again."""
        if (node.metadata.annotations or {}).get(labels.BAD_NODE_REASON) != mark.reason:
            return
        patch: dict[str, Any] = {
            "metadata": {
                "resourceVersion": node.metadata.resource_version,
                "annotations": {labels.BAD_NODE_REASON: None},
            }
        }
        if mark.action is BadNodeAction.CORDON:
            patch["spec"] = {"unschedulable": False}
        else:
            kept = [
                self.serialize(t) for t in node.spec.taints or [] if t.key != labels.BAD_NODE_TAINT
            ]
            patch["spec"] = {"taints": kept}
        with contextlib.suppress(NotFoundError, ConflictError):
            call(self.core.patch_node, mark.node, patch, _content_type=MERGE_PATCH)

    def event(self, body: Mapping[str, Any], spec: EventSpec) -> bool:
        """Create the Event under a name derived from its content: told again, it exists.
        True when this call told it."""
        meta = body["metadata"]
        now = spec.at or dt.datetime.now(dt.UTC)
        event = {
            "metadata": {"name": event_name(meta, spec), "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": spec.type,
            "reason": spec.reason,
            "message": spec.message[:EVENT_MESSAGE_LIMIT],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        # Already told (a name that exists), or lost: the status holds the facts either way.
        try:
            call(self.core.create_namespaced_event, meta["namespace"], event)
        except KubeError:
            return False
        return True

    def bind_cluster_role(
        self, namespace: str, name: str, role: str, account: str, account_namespace: str
    ) -> None:
        """Bind ClusterRole `role` to a ServiceAccount in `namespace` (no-op when bound)."""
        binding = {
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {labels.MANAGED_BY: labels.MANAGER},
            },
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": account, "namespace": account_namespace}
            ],
        }
        with contextlib.suppress(ConflictError):
            call(self.rbac.create_namespaced_role_binding, namespace, binding)

    def save_config(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """Replace a ConfigMap's data, creating the ConfigMap the first time."""
        try:
            call(
                self.core.patch_namespaced_config_map,
                name,
                namespace,
                {"data": data},
                _content_type=MERGE_PATCH,
            )
        except NotFoundError:
            call(
                self.core.create_namespaced_config_map,
                namespace,
                {
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "labels": {labels.MANAGED_BY: labels.MANAGER},
                    },
                    "data": data,
                },
            )

    def delete_job(self, body: Mapping[str, Any]) -> None:
        meta = body["metadata"]
        with contextlib.suppress(NotFoundError):
            call(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                meta["namespace"],
                PLURAL,
                meta["name"],
            )


def event_name(meta: Mapping[str, Any], spec: EventSpec) -> str:
    """`<job>.<digest>` of the job's uid and the Event's content and decision time."""
    key = "\x00".join(
        (
            str(meta.get("uid", "")),
            spec.type,
            spec.reason,
            spec.message,
            spec.at.isoformat() if spec.at else "",
        )
    )
    return f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"
