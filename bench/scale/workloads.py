"""The same fake TPU workload as a TPUTrainingJob, a JobSet or a plain Indexed Job.

Every arm's pods have the same shape: a nodeSelector on the GKE TPU accelerator and topology,
the google.com/tpu toleration, `limits: google.com/tpu`, one container `trainer` whose env
carries kwok's knobs (KWOK_RUN_FOR: run time before the pod succeeds; absent: run until deleted).
Placement of a slice on one node pool is what each arm ships:
  tpujob  the operator picks a free pool and pins it with a nodeSelector;
  jobset  `alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool` (GKE's
          multislice recipe, done by JobSet's pod webhooks);
  job     static: workload i goes to pool i modulo the pools (no controller picks one).
Restarts as shipped: tpujob its own classes; JobSet `maxRestarts` with `backoffLimit: 0`
(restart-all); Job `backoffLimit` (the failed pod is replaced).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from scale.nodes import pool_name, slice_shape

ARMS = ("tpujob", "jobset", "job", "tpujob-kueue", "jobset-kueue")
# The arms under Kueue: the same workload, naming a LocalQueue whose ClusterQueue's quota is
# every pool's chips, with Kueue admitting it (`scale.cluster`).
QUEUED = {"tpujob-kueue": "tpujob", "jobset-kueue": "jobset"}
QUEUE = "bench-queue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PREFIX = {"tpujob": "tj", "jobset": "js", "job": "jb", "tpujob-kueue": "tk", "jobset-kueue": "jk"}
ACCEL = "cloud.google.com/gke-tpu-accelerator"
TOPO = "cloud.google.com/gke-tpu-topology"
POOL = "cloud.google.com/gke-nodepool"
WORKLOAD_OF_POD = re.compile(r"^[a-z]+-\d{4,}")
MAX_RESTARTS = 100


@dataclass(frozen=True)
class Shape:
    """What every workload of a run looks like."""

    accelerator: str = "tpu-v5-lite-podslice"
    topology: str = "4x4"
    run_for: str | None = None
    pools: int = 0  # for the static placement of the Job arm

    @property
    def pods(self) -> int:
        hosts: int = slice_shape(self.topology)[0]
        return hosts


def base(arm: str) -> str:
    """The workload kind an arm runs: a queued arm's is its unqueued one's."""
    return QUEUED.get(arm, arm)


def name(arm: str, i: int) -> str:
    return f"{PREFIX[arm]}-{i:04d}"


def workload_of_pod(pod_name: str) -> str | None:
    """`tj-0007-1-0-2`, `js-0007-slice-0-0-x7k2p`, `jb-0007-0-q8x1z` -> the workload's name."""
    m = WORKLOAD_OF_POD.match(pod_name)
    return m.group(0) if m else None


def _env(shape: Shape) -> list[dict[str, str]]:
    return [{"name": "KWOK_RUN_FOR", "value": shape.run_for}] if shape.run_for else []


def _pod_template(shape: Shape, pool: str | None) -> dict[str, Any]:
    _, chips = slice_shape(shape.topology)
    selector = {ACCEL: shape.accelerator, TOPO: shape.topology}
    if pool:
        selector[POOL] = pool
    return {
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": selector,
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "containers": [
                {
                    "name": "trainer",
                    "image": "kwok.local/fake-trainer:0",
                    "command": ["sleep", "infinity"],
                    "env": _env(shape),
                    "resources": {"limits": {"google.com/tpu": str(chips)}},
                }
            ],
        }
    }


def tpujob(shape: Shape, i: int, namespace: str, arm: str = "tpujob") -> dict[str, Any]:
    return {
        "apiVersion": "tpujob.dev/v1alpha1",
        "kind": "TPUTrainingJob",
        "metadata": {"name": name(arm, i), "namespace": namespace},
        "spec": {
            "tpu": {"accelerator": shape.accelerator, "topology": shape.topology, "slices": 1},
            "trainer": {
                "image": "kwok.local/fake-trainer:0",
                "command": ["sleep", "infinity"],
                "env": _env(shape),
            },
            "recovery": {
                "maxSoftRestarts": MAX_RESTARTS,
                "maxMediumRestarts": MAX_RESTARTS,
                "maxHardRestarts": MAX_RESTARTS,
                "maxFailedNodes": 2,
                "stallTimeoutSeconds": 3600,
                "backoff": {"initialSeconds": 1, "maxSeconds": 4},
            },
        },
    }


def jobset(shape: Shape, i: int, namespace: str, arm: str = "jobset") -> dict[str, Any]:
    hosts = shape.pods
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name(arm, i),
            "namespace": namespace,
            "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": POOL},
        },
        "spec": {
            "failurePolicy": {"maxRestarts": MAX_RESTARTS},
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": hosts,
                            "completions": hosts,
                            "backoffLimit": 0,
                            "completionMode": "Indexed",
                            "template": _pod_template(shape, None),
                        }
                    },
                }
            ],
        },
    }


def job(shape: Shape, i: int, namespace: str) -> dict[str, Any]:
    hosts = shape.pods
    pool = pool_name(i % shape.pools) if shape.pools else None
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name("job", i), "namespace": namespace},
        "spec": {
            "parallelism": hosts,
            "completions": hosts,
            "completionMode": "Indexed",
            "backoffLimit": MAX_RESTARTS,
            "template": _pod_template(shape, pool),
        },
    }


def manifest(arm: str, shape: Shape, i: int, namespace: str) -> dict[str, Any]:
    if arm in QUEUED:
        body = {"tpujob": tpujob, "jobset": jobset}[QUEUED[arm]](shape, i, namespace, arm)
        body["metadata"]["labels"] = {QUEUE_LABEL: QUEUE}
        return body
    build = {"tpujob": tpujob, "jobset": jobset, "job": job}[arm]
    return build(shape, i, namespace)
