"""Names and limits of the TPUTrainingJob API: group, version, kind, and the bounds on lists.

Bottom layer, stdlib only. The bounds keep the CEL cost of the CRD's validation rules inside
the apiserver's budget (the cost of a rule on a list item is multiplied by the list's
maxItems) and keep a job object well below etcd's object size limit.
"""

from __future__ import annotations

GROUP = "tpujob.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TPUTrainingJob"
LIST_KIND = "TPUTrainingJobList"
PLURAL = "tputrainingjobs"
SINGULAR = "tputrainingjob"
SHORT_NAMES = ("tpujob", "tpujobs")
CRD_NAME = f"{PLURAL}.{GROUP}"

# What the operator puts into every trainer pod, which a pod template may not name again.
# Every trainer pod mounts an emptyDir here for scratch (its root filesystem is read-only).
SCRATCH_MOUNT_PATH = "/tmp"
SCRATCH_VOLUME = "tmp"
# And the operator projects the pod's rejoin order into this directory (a slice restart), next
# to the kubelet's /var/run/secrets: a directory no image needs to have.
REJOIN_MOUNT_PATH = "/var/run/tpujob"
REJOIN_VOLUME = "tpujob-rejoin"
CHECKPOINT_VOLUME = "checkpoints"
# The fast local checkpoint tier (spec.checkpoint.local): a memory-backed emptyDir per pod.
LOCAL_CHECKPOINT_MOUNT_PATH = "/local-checkpoints"
LOCAL_CHECKPOINT_VOLUME = "tpujob-local-checkpoints"

# Bounds on user input.
# Leaves room in a 63-character DNS label for the suffixes of derived pod and service names.
MAX_JOB_NAME_LENGTH = 40
MAX_SLICES = 64
# Warm spare pools one job may hold (`spec.tpu.spares`): each is a whole idle slice.
MAX_SPARES = 4
MAX_ARGS = 256
MAX_ARG_LENGTH = 4096
MAX_ENV = 128
# Bounds of a pod template (each list and map, and the keys and values in it).
MAX_TEMPLATE_ITEMS = 64
MAX_NAME_LENGTH = 253
MAX_URI_LENGTH = 1024
MAX_RULES = 32
MAX_RULE_MATCHERS = 32
MAX_PATTERN_LENGTH = 256
MAX_RESTARTS = 10_000
MAX_SECONDS = 7 * 24 * 3600

# Bounds on what the operator writes into status.
# The last attempt a job may have: the heartbeat's attempt, a rejoin order's and a kept slice's
# are read only up to it, so an attempt past it could never be watched or fenced. The restart
# budgets (three classes of MAX_RESTARTS) keep a job far below it.
MAX_ATTEMPT = 1_000_000
TIMELINE_LIMIT = 50
MAX_CONDITIONS = 16
MAX_FAILED_NODES_RECORDED = 512
MAX_CHAIN = 32
MAX_EVIDENCE = 32
MAX_MESSAGE_LENGTH = 4096
