"""The child objects of a job, as data: trainer pods, the headless Service, the heartbeat Lease
and the RBAC that lets the trainer renew only that Lease.

Pure. Pods are created directly (not through a Job or JobSet): the operator restarts a whole
gang at once, picks the node pool of each slice per attempt, keeps pods off nodes the job
blamed, and force-deletes pods stuck on lost nodes, none of which a Job controller offers.
Pod names carry the attempt, so pods of two attempts never share a name or a DNS name; the
pods of a slice kept by a slice restart keep the names (and DNS names) of the attempt they were
created for, and the new attempt's other pods are told those names.
Trainer pods pass Pod Security `restricted` by default (see `tpujob.plan.pod_security`).

The pod's restartPolicy is Never: a pod that ends is the operator's to replace or not. Its
supervised trainer container alone gets a restart rule (KEP-5307, ContainerRestartRules): killed
whole (exit 137: a SIGKILL, or an OOM kill that took the supervisor too) it restarts in its pod,
where the supervisor, finding its state file in the scratch emptyDir, reports the kill on the
heartbeat Lease and waits for the operator's rejoin order as after a failed training process.
An apiserver without the feature gate drops the fields, and the pod ends and is replaced as
before. Only a trainer whose command names the supervisor gets the rule (`supervised`): a process
of one's own would start again as the attempt it was, with nothing reporting the kill.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tpujob.api import Framework, Provisioning, TPUTrainingJob, contract, labels
from tpujob.api.constants import (
    CHECKPOINT_VOLUME,
    LOCAL_CHECKPOINT_MOUNT_PATH,
    LOCAL_CHECKPOINT_VOLUME,
    REJOIN_MOUNT_PATH,
    REJOIN_VOLUME,
    SCRATCH_MOUNT_PATH,
)
from tpujob.observed.admission import PodSetUpdate
from tpujob.plan import pod_security
from tpujob.plan.pod_template import add_pod_set_update, add_template

# Where a trainer pod's rejoin order is projected (see `contract.POD_REJOIN_ANNOTATION`).
REJOIN_FILE = "rejoin"
# The supervisor's state, in the scratch emptyDir (`contract.ENV_SUPERVISOR_STATE`).
SUPERVISOR_STATE_FILE = f"{SCRATCH_MOUNT_PATH}/tpujob-supervisor.json"
BASE_COLLECTIVE_TIMEOUT_SECONDS = 60


@dataclass(frozen=True)
class AttemptSettings:
    """What changes between attempts: the number, the pools, the blamed nodes, the timeouts."""

    attempt: int
    pools: Mapping[int, str]  # slice index -> node pool
    bad_nodes: frozenset[str] = frozenset()
    collective_timeout_seconds: int = BASE_COLLECTIVE_TIMEOUT_SECONDS
    rollback_step: int | None = None  # restore at or before this step (after a NaN loss)
    skip_batches: str | None = None  # data windows every attempt after a rollback skips
    # Slices kept in place by a slice restart -> the attempt their pods' names carry.
    kept: Mapping[int, int] = field(default_factory=dict)
    # The slices the attempt runs on when fewer than the job's (an elastic job degraded).
    slices: int | None = None
    # Slice index -> what Kueue's admission checks ask of its pods (a queued job).
    pod_set_updates: Mapping[int, PodSetUpdate] = field(default_factory=dict)

    def slice_count(self, job: TPUTrainingJob) -> int:
        """The slices the attempt runs on."""
        return self.slices if self.slices is not None else job.spec.tpu.slices

    def pods_attempt(self, slice_index: int) -> int:
        """The attempt in the names of `slice_index`'s pods."""
        return self.kept.get(slice_index, self.attempt)


def owner_reference(job: TPUTrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "name": job.name,
        "uid": job.metadata.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_meta(
    job: TPUTrainingJob, name: str, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {labels.JOB: job.name, labels.MANAGED_BY: labels.MANAGER, **(extra or {})},
        "ownerReferences": [owner_reference(job)],
    }


def pod_name(job: str, attempt: int, slice_index: int, worker: int) -> str:
    return f"{job}-{attempt}-{slice_index}-{worker}"


def service_name(job: TPUTrainingJob) -> str:
    return job.name


def lease_name(job: TPUTrainingJob) -> str:
    return heartbeat_lease_name(job.name)


def heartbeat_lease_name(job_name: str) -> str:
    return f"{job_name}-heartbeat"


def trainer_service_account(job: TPUTrainingJob) -> str:
    return job.spec.trainer.service_account_name or f"{job.name}-trainer"


def host_fqdn(job: TPUTrainingJob, attempt: int, slice_index: int, worker: int) -> str:
    return (
        f"{pod_name(job.name, attempt, slice_index, worker)}.{service_name(job)}."
        f"{job.namespace}.svc.cluster.local"
    )


def coordinator_host(job: TPUTrainingJob, settings: AttemptSettings) -> str:
    """Slice 0 worker 0's DNS name: JAX's coordinator and the multislice one."""
    return host_fqdn(job, settings.pods_attempt(0), 0, 0)


def rejoin_order(job: TPUTrainingJob, settings: AttemptSettings) -> str:
    """The annotation that tells a kept pod to restart its trainer as `settings.attempt`."""
    return contract.encode_rejoin(
        contract.Rejoin(attempt=settings.attempt, coordinator=coordinator_host(job, settings))
    )


def trainer_env(
    job: TPUTrainingJob, settings: AttemptSettings, slice_index: int, worker: int
) -> list[dict[str, Any]]:
    """The env GKE and the operator give a worker: TPU, multislice, JAX and tpujob variables."""
    tpu = job.spec.tpu
    hosts = tpu.hosts_per_slice
    slices = settings.slice_count(job)
    attempt = settings.attempt
    own = settings.pods_attempt(slice_index)
    hostnames = ",".join(host_fqdn(job, own, slice_index, w) for w in range(hosts))
    coordinator = coordinator_host(job, settings)
    checkpoint = job.spec.checkpoint
    values: dict[str, str] = {
        "TPU_WORKER_ID": str(worker),
        "TPU_WORKER_HOSTNAMES": hostnames,
        "TPU_TOPOLOGY": tpu.topology,
        "TPU_ACCELERATOR_TYPE": tpu.shape.tpu_type,
        "TPU_SKIP_MDS_QUERY": "true",
        "MEGASCALE_NUM_SLICES": str(slices),
        "MEGASCALE_SLICE_ID": str(slice_index),
        "MEGASCALE_COORDINATOR_ADDRESS": f"{coordinator}:{labels.MEGASCALE_PORT}",
        "MEGASCALE_PORT": str(labels.MEGASCALE_PORT),
        "JAX_COORDINATOR_ADDRESS": f"{coordinator}:{labels.JAX_COORDINATOR_PORT}",
        "JAX_NUM_PROCESSES": str(slices * hosts),
        "JAX_PROCESS_ID": str(slice_index * hosts + worker),
        contract.ENV_JOB_NAME: job.name,
        contract.ENV_NAMESPACE: job.namespace,
        contract.ENV_ATTEMPT: str(attempt),
        contract.ENV_HEARTBEAT_LEASE: lease_name(job),
        contract.ENV_JOB_UID: str(job.metadata.get("uid", "")),
        contract.ENV_ALLOW_CPU_FALLBACK: str(job.spec.trainer.allow_cpu_fallback).lower(),
        contract.ENV_EXPECT_TPU_CHIPS: str(tpu.chips_per_host),
        contract.ENV_COLLECTIVE_TIMEOUT: str(settings.collective_timeout_seconds),
        contract.ENV_FRAMEWORK: job.spec.framework.value,
    }
    # Every trainer runs under the supervisor: a multislice job keeps its healthy slices when
    # another is replaced, and any job restarts its trainers in their pods after a hang.
    values[contract.ENV_REJOIN_FILE] = f"{REJOIN_MOUNT_PATH}/{REJOIN_FILE}"
    values[contract.ENV_SUPERVISOR_STATE] = SUPERVISOR_STATE_FILE
    if job.spec.elastic is not None:
        values[contract.ENV_PLANNED_SLICES] = str(tpu.slices)
    if settings.rollback_step is not None:
        values[contract.ENV_RESUME_STEP] = str(settings.rollback_step)
    if settings.skip_batches:
        values[contract.ENV_SKIP_BATCHES] = settings.skip_batches
    if checkpoint is not None:
        values[contract.ENV_CHECKPOINT_DIR] = checkpoint.directory
        values[contract.ENV_CHECKPOINT_INTERVAL] = str(checkpoint.interval_steps)
        values[contract.ENV_CHECKPOINT_KEEP] = str(checkpoint.keep)
        if checkpoint.local is not None:
            values[contract.ENV_LOCAL_CHECKPOINT_DIR] = LOCAL_CHECKPOINT_MOUNT_PATH
            values[contract.ENV_LOCAL_CHECKPOINT_INTERVAL] = str(checkpoint.local.interval_steps)
        if job.spec.framework is Framework.JAX:
            values[contract.ENV_JAX_COMPILATION_CACHE_DIR] = compilation_cache_dir(
                checkpoint.directory
            )
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    for var in job.spec.trainer.env:
        item = var.model_dump(by_alias=True, exclude_none=True)
        env = [e for e in env if e["name"] != item["name"]] + [item]
    return env


def compilation_cache_dir(checkpoint_directory: str) -> str:
    """JAX's compilation cache folder for a job: inside its checkpoint directory (a path or a
    gs:// URI), the one place every attempt of the job sees, on whichever nodes it runs."""
    return f"{checkpoint_directory.rstrip('/')}/{contract.COMPILATION_CACHE_FOLDER}"


# The commands that run a trainer under its supervisor: the reference trainer's entry point,
# and the supervisor's module run over a loop of one's own (`python -m tpujob_trainer.rejoin`).
SUPERVISOR_ENTRY = "tpujob-trainer"
SUPERVISOR_MODULES = ("tpujob_trainer", "tpujob_trainer.rejoin")


def supervised(container: Mapping[str, Any]) -> bool:
    """Whether the trainer in `container` is known to run under its supervisor: its command
    names the supervisor (`SUPERVISOR_ENTRY`, or `python -m` one of `SUPERVISOR_MODULES`), the
    pod projects a rejoin order, and neither its env (`contract.ENV_SUPERVISED`, which a
    supervisor sets for the process it runs) nor its words (`contract.NO_REJOIN_FLAG`) say it
    runs without one.

    Only then may its container restart in its pod: a process of one's own restarted by the
    kubelet would start again as the attempt it was, with nothing reporting the kill, and an
    OOM that repeats would loop in the pod where the operator never sees it end. A container
    with no command runs its image's entry point, which the operator cannot read: no rule."""
    command = [str(word) for word in container.get("command") or []]
    names = {str(e.get("name")) for e in container.get("env") or []}
    words = [*command, *(str(a) for a in container.get("args") or [])]
    named = bool(command) and (
        command[0].rsplit("/", 1)[-1] == SUPERVISOR_ENTRY
        or any(
            command[i] == "-m" and command[i + 1] in SUPERVISOR_MODULES
            for i in range(len(command) - 1)
        )
    )
    return (
        named
        and contract.ENV_REJOIN_FILE in names
        and contract.ENV_SUPERVISED not in names
        and contract.NO_REJOIN_FLAG not in words
    )


def container_restart_rules() -> dict[str, Any]:
    """The container fields that restart a supervised trainer killed whole in its pod."""
    return {
        "restartPolicy": "Never",
        "restartPolicyRules": [
            {
                "action": "Restart",
                "exitCodes": {
                    "operator": "In",
                    "values": list(contract.CONTAINER_RESTART_EXIT_CODES),
                },
            }
        ],
    }


def local_checkpoint_volume(size_limit: str) -> dict[str, Any]:
    """The local checkpoint tier's volume: memory-backed, at most `size_limit`."""
    return {
        "name": LOCAL_CHECKPOINT_VOLUME,
        "emptyDir": {"medium": "Memory", "sizeLimit": size_limit},
    }


def _rejoin_volume() -> dict[str, Any]:
    """The pod's rejoin order (`contract.POD_REJOIN_ANNOTATION`) as a file, kept up to date by
    the kubelet, for the trainer's supervisor to read."""
    return {
        "name": REJOIN_VOLUME,
        "downwardAPI": {
            "items": [
                {
                    "path": REJOIN_FILE,
                    "fieldRef": {
                        "fieldPath": f"metadata.annotations['{contract.POD_REJOIN_ANNOTATION}']"
                    },
                }
            ]
        },
    }


def gang(job: TPUTrainingJob, slice_index: int) -> str:
    """The `labels.GANG` value of one slice's pods: the same in every attempt, unique in the
    cluster (job uids are), and a valid label value whatever the job's name."""
    key = job.metadata.get("uid") or f"{job.namespace}/{job.name}"
    return hashlib.sha256(f"{key}/{slice_index}".encode()).hexdigest()[:20]


def _gang_affinity(value: str) -> dict[str, Any]:
    """One slice alone in one pool, whichever pool it is: each pod goes where the slice's other
    pods are (the first anywhere), and never into a pool another slice's pods are in, of any
    job or namespace. What a pool per slice needs when no pool is named (GKE's autoscaler and
    node auto-provisioning then see pods that fit only a new or empty pool)."""
    return {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {labels.GANG: value}},
                    "topologyKey": labels.NODEPOOL,
                }
            ]
        },
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [
                            {"key": labels.GANG, "operator": "Exists"},
                            {"key": labels.GANG, "operator": "NotIn", "values": [value]},
                        ]
                    },
                    "namespaceSelector": {},
                    "topologyKey": labels.NODEPOOL,
                }
            ]
        },
    }


def _affinity(bad_nodes: frozenset[str], gang_value: str | None) -> dict[str, Any] | None:
    affinity: dict[str, Any] = _gang_affinity(gang_value) if gang_value else {}
    if bad_nodes:
        term = {
            "matchExpressions": [
                {"key": labels.HOSTNAME, "operator": "NotIn", "values": sorted(bad_nodes)}
            ]
        }
        affinity["nodeAffinity"] = {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    return affinity or None


def trainer_pod(
    job: TPUTrainingJob, settings: AttemptSettings, slice_index: int, worker: int
) -> dict[str, Any]:
    tpu, trainer = job.spec.tpu, job.spec.trainer
    name = pod_name(job.name, settings.pods_attempt(slice_index), slice_index, worker)
    resources: dict[str, Any] = {}
    if tpu.chips_per_host:
        resources["limits"] = {labels.TPU_RESOURCE: str(tpu.chips_per_host)}
    if trainer.resources is not None:
        requests = trainer.resources.model_dump(by_alias=True, exclude_none=True)
        if requests:
            resources["requests"] = {k: str(v) for k, v in requests.items()}
        if "memory" in requests:
            # The host memory the trainer may use: past it the kernel kills it (OOMKilled),
            # which the operator grades (a leak it warned of is a leak, not a soft failure).
            resources.setdefault("limits", {})["memory"] = str(requests["memory"])
    container: dict[str, Any] = {
        "name": "trainer",
        "image": trainer.image,
        "env": trainer_env(job, settings, slice_index, worker),
        "resources": resources,
        "terminationMessagePath": contract.TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "ports": [{"name": "coordinator", "containerPort": labels.JAX_COORDINATOR_PORT}],
        "securityContext": pod_security.container_security_context(trainer.security),
        "volumeMounts": [
            pod_security.scratch_mount(),
            {"name": REJOIN_VOLUME, "mountPath": REJOIN_MOUNT_PATH, "readOnly": True},
        ],
    }
    if trainer.command:
        container["command"] = list(trainer.command)
    if trainer.args:
        container["args"] = list(trainer.args)
    if supervised(container):
        container.update(container_restart_rules())
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "hostname": name,
        "subdomain": service_name(job),
        "serviceAccountName": trainer_service_account(job),
        "securityContext": pod_security.pod_security_context(trainer.security),
        "terminationGracePeriodSeconds": job.spec.trainer.termination_grace_period_seconds,
        "nodeSelector": {labels.ACCELERATOR: tpu.accelerator, labels.TOPOLOGY: tpu.topology},
        "tolerations": [{"key": labels.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
        "volumes": [pod_security.scratch_volume(), _rejoin_volume()],
    }
    pool = settings.pools.get(slice_index)
    if pool:
        spec["nodeSelector"][labels.NODEPOOL] = pool
    unpinned = not pool and tpu.provisioning is Provisioning.AUTOSCALE
    if affinity := _affinity(settings.bad_nodes, gang(job, slice_index) if unpinned else None):
        spec["affinity"] = affinity
    volume = job.spec.checkpoint.volume if job.spec.checkpoint else None
    if volume is not None:
        source: dict[str, Any] = (
            {"persistentVolumeClaim": {"claimName": volume.claim_name}}
            if volume.claim_name
            else {"hostPath": {"path": volume.host_path, "type": "DirectoryOrCreate"}}
        )
        spec["volumes"].append({"name": CHECKPOINT_VOLUME, **source})
        container["volumeMounts"].append(
            {"name": CHECKPOINT_VOLUME, "mountPath": volume.mount_path}
        )
    local = job.spec.checkpoint.local if job.spec.checkpoint else None
    if local is not None:
        # A tmpfs of the pod's own: it outlives a training process restarted in place (the
        # supervisor keeps the pod) and goes with the pod, so a replaced pod starts empty.
        spec["volumes"].append(local_checkpoint_volume(local.size_limit))
        container["volumeMounts"].append(
            {"name": LOCAL_CHECKPOINT_VOLUME, "mountPath": LOCAL_CHECKPOINT_MOUNT_PATH}
        )
    extra = {
        labels.ATTEMPT: str(settings.attempt),
        labels.SLICE: str(slice_index),
        labels.WORKER: str(worker),
        labels.GANG: gang(job, slice_index),
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": child_meta(job, name, extra),
        "spec": spec,
    }
    pod = add_template(pod, trainer.pod_template, trainer.volume_mounts)
    return add_pod_set_update(pod, settings.pod_set_updates.get(slice_index))


def attempt_pods(job: TPUTrainingJob, settings: AttemptSettings) -> list[dict[str, Any]]:
    """The pods an attempt creates: every worker's but those of the slices it keeps."""
    tpu = job.spec.tpu
    return [
        trainer_pod(job, settings, s, w)
        for s in range(settings.slice_count(job))
        if s not in settings.kept
        for w in range(tpu.hosts_per_slice)
    ]


def headless_service(job: TPUTrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(job, service_name(job)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {labels.JOB: job.name},
            "ports": [{"name": "coordinator", "port": labels.JAX_COORDINATOR_PORT}],
        },
    }


def heartbeat_lease(job: TPUTrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": child_meta(job, lease_name(job)),
        "spec": {"holderIdentity": f"{job.name}-worker-0"},
    }


def heartbeat_rbac(job: TPUTrainingJob) -> list[dict[str, Any]]:
    """ServiceAccount (unless the user named one), Role and RoleBinding for the heartbeat only."""
    account = trainer_service_account(job)
    role = f"{job.name}-heartbeat"
    objects: list[dict[str, Any]] = []
    if job.spec.trainer.service_account_name is None:
        objects.append(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": child_meta(job, account)}
        )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": child_meta(job, role),
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [lease_name(job)],
                    "verbs": ["get", "update", "patch"],
                }
            ],
        }
    )
    objects.append(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": child_meta(job, role),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": job.namespace}],
        }
    )
    return objects
