"""The TPUTrainingJob API (tpujob.dev/v1alpha1) as pydantic models: the one source of truth.

Bottom layer: no I/O, no kopf, no kubernetes client. The CRD in `crds/` is generated from
these models by `tpujob.crdgen`; the operator parses bodies with `parse_job` and writes status
with `status_patch`.
"""

from tpujob.api.constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from tpujob.api.enums import (
    BadNodeAction,
    ConditionStatus,
    ConditionType,
    FailureClass,
    Framework,
    Phase,
    Provisioning,
)
from tpujob.api.job import (
    FieldError,
    InvalidJobError,
    TPUTrainingJob,
    field_errors,
    parse_job,
    parse_status,
)
from tpujob.api.recovery import Backoff, RecoverySpec, UserRule
from tpujob.api.spec import (
    CheckpointSpec,
    CheckpointVolume,
    ElasticSpec,
    TPUSpec,
    TPUTrainingJobSpec,
)
from tpujob.api.status import (
    Condition,
    FailedNode,
    GoodputBreakdown,
    LastFailure,
    PendingEvent,
    Progress,
    Restarts,
    TimelineEvent,
    TPUTrainingJobStatus,
    status_patch,
)
from tpujob.api.trainer import EnvVar, HostResources, TrainerSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Backoff",
    "BadNodeAction",
    "CheckpointSpec",
    "CheckpointVolume",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "ElasticSpec",
    "EnvVar",
    "FailedNode",
    "FailureClass",
    "FieldError",
    "Framework",
    "GoodputBreakdown",
    "HostResources",
    "InvalidJobError",
    "LastFailure",
    "PendingEvent",
    "Phase",
    "Progress",
    "Provisioning",
    "RecoverySpec",
    "Restarts",
    "TPUSpec",
    "TPUTrainingJob",
    "TPUTrainingJobSpec",
    "TPUTrainingJobStatus",
    "TimelineEvent",
    "TrainerSpec",
    "UserRule",
    "field_errors",
    "parse_job",
    "parse_status",
    "status_patch",
]
