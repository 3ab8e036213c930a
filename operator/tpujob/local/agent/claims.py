"""PersistentVolumeClaims on the local node: a claim bound to a local PersistentVolume mounts
the PV's directory, as a kubelet mounts a Filestore or persistent-disk claim on GKE.

The cluster's admin makes the PVs (static `hostPath` or `local` PVs; the local cluster has no
provisioner) and the controller-manager's PV controller binds claims to them. A pod names only
its claim, so a job in a `restricted` namespace, where hostPath volumes are refused, still
checkpoints to a directory of the machine. The binding is checked both ways (the claim is Bound
to the PV and the PV's claimRef is that claim, by UID): a user can write any volumeName into a
claim, but only the PV controller binds a PV back to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpujob.local.agent import hostpaths


class ClaimError(RuntimeError):
    """The claim cannot be mounted; the pod fails to start with this message."""


class ClaimLookups(Protocol):
    """Reads of claims and volumes, as the node's identity."""

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def volume(self, name: str) -> dict[str, Any] | None: ...


def claim_path(namespace: str, claim_name: str, lookups: ClaimLookups) -> Path:
    """The host directory behind the claim `namespace/claim_name`; ClaimError if there is none."""
    claim = lookups.claim(namespace, claim_name)
    if claim is None:
        raise ClaimError(f'persistentvolumeclaim "{claim_name}" not found')
    if (claim.get("status") or {}).get("phase") != "Bound":
        raise ClaimError(f'persistentvolumeclaim "{claim_name}" is not bound')
    pv_name = (claim.get("spec") or {}).get("volumeName") or ""
    volume = lookups.volume(pv_name) if pv_name else None
    if volume is None:
        raise ClaimError(f'persistentvolume "{pv_name}" of claim "{claim_name}" not found')
    ref = (volume.get("spec") or {}).get("claimRef") or {}
    meta = claim.get("metadata") or {}
    if (ref.get("namespace"), ref.get("name"), ref.get("uid")) != (
        namespace,
        claim_name,
        meta.get("uid"),
    ):
        raise ClaimError(f'persistentvolume "{pv_name}" is not bound to claim "{claim_name}"')
    spec = volume.get("spec") or {}
    source = spec.get("hostPath") or spec.get("local")
    if not source or not str(source.get("path", "")).startswith("/"):
        raise ClaimError(
            f'persistentvolume "{pv_name}": only hostPath and local volumes mount on the local node'
        )
    path = Path(source["path"])
    if "hostPath" in spec:
        # The kubelet's hostPath plugin, as for a pod's own hostPath volume: DirectoryOrCreate
        # makes the folder, an untyped path is not checked.
        try:
            return hostpaths.prepare(path, source.get("type"))
        except hostpaths.HostPathError as err:
            raise ClaimError(f'persistentvolume "{pv_name}": {err}') from err
    if not path.is_dir():  # a local volume's path must exist: the kubelet makes none
        raise ClaimError(f'persistentvolume "{pv_name}": {path} is not a directory')
    return path


class ApiClaims:
    """`ClaimLookups` over the Kubernetes API."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self.core = core

    def _read(self, read: Any, *args: str) -> dict[str, Any] | None:
        try:
            obj = read(*args)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return dict(self.core.api_client.sanitize_for_serialization(obj))

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    def volume(self, name: str) -> dict[str, Any] | None:
        return self._read(self.core.read_persistent_volume, name)
