"""A job's pod template, and what Kueue's admission checks ask of a pod set's pods, merged
into a worker pod the operator built.

Pure. Admission already refuses a template that names one of the operator's fields; the merge
still lets the operator's values win (its labels, selectors, volumes), so a template stored
before a rule existed cannot take a slice off its pool or hide the scratch volume. The same
holds for an admission check's pod set update: its labels, annotations, node selectors and
tolerations are added, never in place of the operator's or the template's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tpujob.api.pod_template import PodTemplate, VolumeMount
from tpujob.api.trainer import TrainerSpec
from tpujob.observed.admission import PodSetUpdate

# What a pod on the node's network needs to still resolve the job's headless Service (its
# peers' and coordinator's names): the default ClusterFirst falls back to the node's resolver.
HOST_NETWORK_DNS_POLICY = "ClusterFirstWithHostNet"


def add_template(
    pod: dict[str, Any], template: PodTemplate | None, mounts: Sequence[VolumeMount] = ()
) -> dict[str, Any]:
    """`pod` with the template's fields added under the operator's (changed in place)."""
    container = pod["spec"]["containers"][0]
    taken_paths = {m["mountPath"] for m in container.get("volumeMounts", [])}
    for mount in mounts:
        if mount.mount_path not in taken_paths:
            container.setdefault("volumeMounts", []).append(
                mount.model_dump(mode="json", by_alias=True, exclude_none=True)
            )
    if template is None:
        return pod
    meta, spec = pod["metadata"], pod["spec"]
    if template.metadata.labels:
        meta["labels"] = {**template.metadata.labels, **meta.get("labels", {})}
    if template.metadata.annotations:
        meta["annotations"] = {**template.metadata.annotations, **meta.get("annotations", {})}
    extra = template.spec
    if extra.node_selector:
        spec["nodeSelector"] = {**extra.node_selector, **spec.get("nodeSelector", {})}
    if extra.tolerations:
        spec["tolerations"] = list(spec.get("tolerations", [])) + [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in extra.tolerations
        ]
    taken = {v["name"] for v in spec.get("volumes", [])}
    volumes = [
        v.model_dump(mode="json", by_alias=True, exclude_none=True)
        for v in extra.volumes
        if v.name not in taken
    ]
    if volumes:
        spec["volumes"] = list(spec.get("volumes", [])) + volumes
    if extra.priority_class_name:
        spec["priorityClassName"] = extra.priority_class_name
    if extra.host_network:
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = HOST_NETWORK_DNS_POLICY
    if extra.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s.name} for s in extra.image_pull_secrets]
    return pod


def add_pod_set_update(pod: dict[str, Any], update: PodSetUpdate | None) -> dict[str, Any]:
    """`pod` with an admission check's update added under what it has (changed in place)."""
    if update is None:
        return pod
    meta, spec = pod["metadata"], pod["spec"]
    for field, added, into in (
        ("labels", update.labels, meta),
        ("annotations", update.annotations, meta),
        ("nodeSelector", update.node_selector, spec),
    ):
        if added:
            into[field] = {**added, **into.get(field, {})}
    have = spec.get("tolerations", [])
    new = [dict(t) for t in update.tolerations if dict(t) not in have]
    if new:
        spec["tolerations"] = list(have) + new
    return pod


def selects(trainer: TrainerSpec, node_labels: Mapping[str, str]) -> bool:
    """Whether the template's node selectors let the worker pods onto a node with these labels:
    a pool whose nodes lack a selected label (a reservation, spot) is no place for the slice,
    whose pods would wait there for ever."""
    template = trainer.pod_template
    if template is None:
        return True
    return all(node_labels.get(k) == v for k, v in template.spec.node_selector.items())
