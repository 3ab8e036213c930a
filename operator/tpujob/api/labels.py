"""Label, annotation and taint names the operator puts on the objects it creates or marks."""

from __future__ import annotations

from tpujob.api.constants import GROUP

JOB = f"{GROUP}/job"
ATTEMPT = f"{GROUP}/attempt"
SLICE = f"{GROUP}/slice"
WORKER = f"{GROUP}/worker"
# One slice's pods, whatever the attempt: what keeps them in one pool, and other slices out.
GANG = f"{GROUP}/gang"
# On a warm spare's idle pods ("true"): they hold a pool for the job, and train nothing.
SPARE = f"{GROUP}/spare"
MANAGED_BY = "app.kubernetes.io/managed-by"
# The Kueue LocalQueue a job asks to be admitted through, as every Kueue integration names it.
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
MANAGER = "tpujob-operator"
# The finalizer kopf keeps on every job while its daemon runs.
FINALIZER = f"{GROUP}/operator"

# The taint put on a node blamed for a hard failure (spec.recovery.badNodeAction: taint).
BAD_NODE_TAINT = f"{GROUP}/unhealthy"
# Node annotation naming the job that blamed the node and why.
BAD_NODE_REASON = f"{GROUP}/unhealthy-reason"

NODEPOOL = "cloud.google.com/gke-nodepool"
ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
TOPOLOGY = "cloud.google.com/gke-tpu-topology"
HOSTNAME = "kubernetes.io/hostname"
TPU_RESOURCE = "google.com/tpu"

# Node state the diagnosis and the placement read.
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"
MAINTENANCE_TAINTS = (
    "cloud.google.com/impending-node-termination",
    "cloud.google.com/maintenance-window-started",
)
MAINTENANCE_LABELS = {
    "cloud.google.com/active-node-maintenance": "ONGOING",
    "cloud.google.com/perform-maintenance": "true",
}

# Ports of the trainer processes.
JAX_COORDINATOR_PORT = 8476
MEGASCALE_PORT = 8081

# GKE's notice of an upcoming host maintenance: the start, in Unix seconds.
SCHEDULED_MAINTENANCE_LABEL = "cloud.google.com/scheduled-maintenance-time"
# Taint effect the node-lifecycle controller uses once it has given up on a node.
NO_EXECUTE = "NoExecute"
# Namespaces whose Leases belong to the cluster itself (leader election, node heartbeats).
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-node-lease", "kube-public"})
