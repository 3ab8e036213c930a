"""The goodput benchmark's workloads: the TPUTrainingJob and, with the same trainer and pod, a
JobSet in each of its restart modes (`bench_goodput.py` runs them; `bench_soak.py` runs the job).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from scale import peers

from tpujob.api import GROUP, VERSION, contract, labels, parse_job
from tpujob.local import controlplane
from tpujob.plan import manifests

POOLS = controlplane.PoolOptions(
    pools=3, accelerator="tpu-v4-podslice", topology="2x2x2", spare_nodes=1
)
SLICES, HOSTS = 2, 2
# One log line a step: the lost seconds are cut at the first step after a restart.
TRAINER_OPTIONS = ("--step-time", "0.1", "--batch-size", "16")
TRAINER_ARGS = ["--steps", "10000000", *TRAINER_OPTIONS, "--log-every", "1"]
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_MODES = {
    "jobset": "restart-all",
    "jobset-restartjob": "RestartJob",
    "jobset-inplace": "InPlaceRestart",
}
IN_PLACE_AGENT = "jobset-in-place-restart-agent"


def job_manifest(namespace: str, checkpoints: Path, *, rejoin: bool = True) -> dict[str, Any]:
    # With --no-rejoin the trainer does not run under its supervisor, and says so on its
    # heartbeat: the operator then replaces every pod on every failure.
    args = TRAINER_ARGS if rejoin else [*TRAINER_ARGS, "--no-rejoin"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUTrainingJob",
        "metadata": {"name": "run", "namespace": namespace},
        "spec": {
            "tpu": {"accelerator": POOLS.accelerator, "topology": POOLS.topology, "slices": SLICES},
            "trainer": {
                "image": "local",
                "command": ["tpujob-trainer"],
                "args": args,
                "allowCpuFallback": True,
            },
            "checkpoint": {
                "volume": {"hostPath": str(checkpoints)},
                "intervalSteps": 20,
                "keep": 2,
            },
            "recovery": {
                "maxFailedNodes": SLICES * HOSTS // 2,
                "maxHardRestarts": 100,
                "maxSoftRestarts": 100,
                "maxMediumRestarts": 100,
            },
        },
    }


def jobset_manifest(
    namespace: str, checkpoints: Path, max_restarts: int, arm: str = "jobset"
) -> dict[str, Any]:
    """The pod tpujob renders for one worker, made generic: each pod works out its slice and
    worker from JobSet's and the Job controller's indexes, as GKE's TPU webhook tells a JobSet
    pod; the operator's heartbeat Lease and fencing are left out (nothing would renew or read
    them), and so is the rejoin order file (JobSet has its own way to keep pods). `arm` picks
    the restart mode (`JOBSET_MODES`)."""
    job = parse_job(job_manifest(namespace, checkpoints, rejoin=False))
    pod = manifests.trainer_pod(job, manifests.AttemptSettings(attempt=1, pools={}), 0, 0)
    container = pod["spec"]["containers"][0]
    per_host = {
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "MEGASCALE_SLICE_ID",
        "MEGASCALE_COORDINATOR_ADDRESS",
        "JAX_COORDINATOR_ADDRESS",
        "JAX_PROCESS_ID",
        contract.ENV_HEARTBEAT_LEASE,
        contract.ENV_JOB_UID,
        contract.ENV_REJOIN_FILE,
    }
    env = [e for e in container["env"] if e["name"] not in per_host]
    env += [
        {
            "name": "SLICE",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX}']"}},
        },
        {
            "name": "WORKER",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
        },
    ]
    host = "run-slice-{slice}-{worker}.run." + namespace + ".svc.cluster.local"
    coordinator = host.format(slice=0, worker=0)
    script = "; ".join(
        [
            "export TPU_WORKER_ID=$WORKER MEGASCALE_SLICE_ID=$SLICE",
            f"export JAX_PROCESS_ID=$(( SLICE * {HOSTS} + WORKER ))",
            "export TPU_WORKER_HOSTNAMES="
            + ",".join(host.format(slice="$SLICE", worker=w) for w in range(HOSTS)),
            f"export JAX_COORDINATOR_ADDRESS={coordinator}:{labels.JAX_COORDINATOR_PORT}",
            f"export MEGASCALE_COORDINATOR_ADDRESS={coordinator}:{labels.MEGASCALE_PORT}",
            'exec "$@"',
        ]
    )
    trainer = [*container.get("command", []), *container.get("args", [])]
    command = ["sh", "-c", script, "trainer", *trainer]
    if arm == "jobset-inplace":
        # The agent is the container and runs the trainer once every pod reached its attempt.
        env += [
            {"name": "WORKER_COMMAND", "value": script.replace('"$@"', shlex.join(trainer))},
            {"name": "SHELL", "value": "/bin/sh"},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "JOBSET_NAME",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"
                    }
                },
            },
        ]
        command = [str(peers.peers_dir() / IN_PLACE_AGENT)]
    container.update(
        command=command,
        env=env,
        volumeMounts=[m for m in container["volumeMounts"] if m["name"] != manifests.REJOIN_VOLUME],
    )
    pod["spec"]["volumes"] = [
        v for v in pod["spec"]["volumes"] if v["name"] != manifests.REJOIN_VOLUME
    ]
    container.pop("args", None)
    spec = {
        k: v
        for k, v in pod["spec"].items()
        if k
        not in (
            "hostname",
            "subdomain",
            "affinity",
            "serviceAccountName",
            "automountServiceAccountToken",
        )
    }
    spec["restartPolicy"] = "Never"
    job_spec: dict[str, Any] = {
        "parallelism": HOSTS,
        "completions": HOSTS,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": {"spec": spec},
    }
    policy: dict[str, Any] = {"maxRestarts": max_restarts}
    if arm == "jobset-restartjob":
        policy["rules"] = [{"name": "RecreateFailedSlice", "action": "RestartJob"}]
    elif arm == "jobset-inplace":
        # What the webhook asks of an in-place JobSet: the pods are kept and never given up.
        policy["restartStrategy"] = "InPlaceRestart"
        spec["restartPolicy"] = "OnFailure"
        job_spec.update(backoffLimit=2147483647, podReplacementPolicy="Failed")
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "run",
            "namespace": namespace,
            "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": labels.NODEPOOL},
        },
        "spec": {
            "failurePolicy": policy,
            "network": {"enableDNSHostnames": True},
            "replicatedJobs": [
                {"name": "slice", "replicas": SLICES, "template": {"spec": job_spec}}
            ],
        },
    }


def agent_role(namespace: str) -> list[dict[str, Any]]:
    """What JobSet's in-place restart agent does with the pod's service account: reads its
    JobSet, writes its own pod's attempt annotation (a Role and its binding)."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "in-place-restart-agent", "namespace": namespace},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]},
            {
                "apiGroups": ["jobset.x-k8s.io"],
                "resources": ["jobsets"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "in-place-restart-agent", "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        },
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": namespace}],
    }
    return [role, binding]
