"""What keeps a trainer pod from hurting its node: security contexts and host path prefixes.

Pure. Trainer pods pass Pod Security `restricted` unless the job's `spec.trainer.security`
relaxes them, and what it relaxes is judged again by the namespace's Pod Security level when the
pods are created: the operator never widens what a namespace allows. `hostPath` checkpoint
volumes are refused at admission by the chart's ValidatingAdmissionPolicy unless they lie under
a prefix of the chart value `hostPathPrefixes`; `hostpath_allowed` is the same rule in Python
(the policy's CEL and this function are tested against the same table of paths).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tpujob.api.constants import SCRATCH_MOUNT_PATH, SCRATCH_VOLUME
from tpujob.api.trainer import TrainerSecurity

# The chart value (and operator setting) listing the node paths jobs may mount; empty refuses
# every hostPath, which is what a shared GKE cluster wants.
HOSTPATH_SETTING = "hostPathPrefixes"
SCRATCH_PATH = SCRATCH_MOUNT_PATH
# Bounds what one tenant's scratch files can take from a TPU host's boot disk; past it the
# kubelet evicts the pod, a failure the diagnosis reports as an eviction.
SCRATCH_SIZE_LIMIT = "16Gi"


def pod_security_context(security: TrainerSecurity) -> dict[str, Any]:
    """The pod-level securityContext: who the processes are and the seccomp profile."""
    return {
        "runAsNonRoot": not security.allow_root,
        "runAsUser": security.run_as_user,
        "runAsGroup": security.run_as_group,
        "fsGroup": security.fs_group,
        "seccompProfile": {"type": str(security.seccomp_profile)},
    }


def container_security_context(security: TrainerSecurity) -> dict[str, Any]:
    """The container-level securityContext: no privilege escalation, every capability dropped."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if security.add_capabilities:
        capabilities["add"] = sorted(set(security.add_capabilities))
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": security.read_only_root_filesystem,
        "capabilities": capabilities,
    }


def scratch_volume() -> dict[str, Any]:
    """An emptyDir for /tmp: the root filesystem is read-only, and Python and JAX need scratch."""
    return {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": SCRATCH_SIZE_LIMIT}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH}


def normalize_prefix(prefix: str) -> str:
    """`prefix` without trailing slashes ("/" stays "/"), as the chart writes it into the policy."""
    return prefix.rstrip("/") or "/"


def hostpath_allowed(path: str, prefixes: Iterable[str]) -> bool:
    """True when `path` is one of `prefixes` or lies below one of them.

    Compared by whole components, so `/data` allows `/data/x` but not `/database`. A path with
    a `..` component is refused outright: the node resolves it, so it could climb out of any
    prefix. A relative path or prefix allows nothing, and no prefixes allow nothing.
    """
    if not path.startswith("/") or ".." in path.split("/"):
        return False
    for prefix in prefixes:
        if not prefix.startswith("/"):
            continue
        base = normalize_prefix(prefix)
        if base in ("/", path) or path.startswith(base + "/"):
            return True
    return False
