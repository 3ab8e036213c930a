"""spec of a TPUTrainingJob: the slices to run on, the trainer, checkpoints and recovery.

Part of the API layer (pydantic and `tpujob.api.topology` only). Hosts per slice and chips per
host are derived from the accelerator/topology table; users never type them.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.config import JsonDict

from tpujob.api import cel as topology_cel
from tpujob.api import constants as c
from tpujob.api import topology as topology_table
from tpujob.api.base import DnsSubdomain, Quantity, SpecModel, cel, validations
from tpujob.api.enums import Framework, Provisioning
from tpujob.api.recovery import RecoverySpec
from tpujob.api.trainer import TrainerSpec

DEFAULT_CHECKPOINT_INTERVAL_STEPS = 100
DEFAULT_CHECKPOINT_KEEP = 3
DEFAULT_CHECKPOINT_MOUNT_PATH = "/checkpoints"
DEFAULT_LOCAL_CHECKPOINT_INTERVAL_STEPS = 10
# The local tier holds two steps of one host's state; a small model's fits many times over.
DEFAULT_LOCAL_CHECKPOINT_SIZE = "2Gi"
# Cloud Storage only: every trainer image carries what orbax needs for it (gcsfs and
# TensorStore's GCS driver). A bucket name is 3-222 characters of lowercase letters, digits,
# '-', '_' and '.', starting and ending with a letter or digit. A local directory is a volume
# (spec.checkpoint.volume), not a file:// URI, so that the operator knows to mount it.
CHECKPOINT_URI_PATTERN = r"^gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/[^\s]*)?$"
ABSOLUTE_PATH_PATTERN = r"^/[^\s]*$"
SCRATCH_MOUNT_PATH = c.SCRATCH_MOUNT_PATH
REJOIN_MOUNT_PATH = c.REJOIN_MOUNT_PATH


def _immutable(what: str) -> JsonDict:
    return validations(
        cel("self == oldSelf", f"{what} is immutable; create a new job to change it")
    )


class TPUSpec(SpecModel):
    """The TPU slices the job runs on."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            *topology_cel.topology_rules(),
            topology_cel.multislice_rule(),
            cel(
                "!has(self.spares) || self.spares == 0 || !has(self.provisioning) || "
                "self.provisioning == 'ExistingPools'",
                "spares needs provisioning ExistingPools: a spare is a pool that exists",
                field_path=".spares",
            ),
        )
    )

    accelerator: str = Field(
        description=(
            "GKE TPU accelerator, the cloud.google.com/gke-tpu-accelerator node label value."
        ),
        json_schema_extra={
            "enum": list(topology_table.accelerator_labels()),
            **_immutable("accelerator"),
        },
    )
    topology: str = Field(
        max_length=16,
        description=(
            "Chip topology of one slice (cloud.google.com/gke-tpu-topology), e.g. 4x4 or "
            "4x4x8; must be one offered for the accelerator."
        ),
        json_schema_extra=_immutable("topology"),
    )
    slices: int = Field(
        default=1,
        ge=1,
        le=c.MAX_SLICES,
        description="Number of identical slices (more than one is multislice over DCN).",
        json_schema_extra=_immutable("slices"),
    )
    provisioning: Provisioning = Field(
        default=Provisioning.EXISTING_POOLS,
        description=(
            "ExistingPools (the default): a slice starts only on a free node pool that exists, "
            "and the job waits (WaitingForPool) for one. Autoscale: a slice with no free pool "
            "gets its pods anyway, kept together in one pool of their own and no other job's, "
            "so that GKE's cluster autoscaler or node auto-provisioning creates or scales up "
            "a pool for them; the pool they land in is recorded and kept."
        ),
    )

    spares: int = Field(
        default=0,
        ge=0,
        le=c.MAX_SPARES,
        description=(
            "Whole node pools of the slice's shape the job keeps ready for its hard failures "
            "(warm spares): while the job runs, each is held by idle pods that ask for its "
            "chips and run the trainer's image, so no other job takes it and its nodes stay "
            "up with the image pulled. A slice moved off a broken node goes to a spare first, "
            "without waiting for a pool to free; the reserve is refilled from free pools. "
            "The spares' chips are the job's and stay idle."
        ),
    )

    @field_validator("accelerator")
    @classmethod
    def _known_accelerator(cls, label: str) -> str:
        topology_table.accelerator(label)
        return label

    @field_validator("topology")
    @classmethod
    def _offered_topology(cls, topo: str, info: ValidationInfo) -> str:
        label = info.data.get("accelerator")
        if label is not None:
            topology_table.resolve(label, topo)
        return topo

    @model_validator(mode="after")
    def _multislice_needs_multi_host(self) -> TPUSpec:
        if self.slices > 1 and not self.shape.multi_host:
            raise ValueError(
                f"slices > 1 (multislice) needs a multi-host topology; "
                f"{self.accelerator} {self.topology} is a single host"
            )
        return self

    @model_validator(mode="after")
    def _spares_need_existing_pools(self) -> TPUSpec:
        if self.spares and self.provisioning is not Provisioning.EXISTING_POOLS:
            raise ValueError(
                "spares needs provisioning ExistingPools: a spare is a pool that exists"
            )
        return self

    @property
    def shape(self) -> topology_table.SliceShape:
        """The geometry of one slice."""
        return topology_table.resolve(self.accelerator, self.topology)

    @property
    def hosts_per_slice(self) -> int:
        """Worker pods (GKE TPU nodes) per slice."""
        return self.shape.hosts

    @property
    def total_hosts(self) -> int:
        """Worker pods across all slices."""
        return self.shape.hosts * self.slices

    @property
    def chips_per_host(self) -> int:
        """`google.com/tpu` chips each worker pod requests."""
        return self.shape.chips_per_host


class CheckpointVolume(SpecModel):
    """A volume mounted into every worker to hold checkpoints."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.claimName) != has(self.hostPath)",
                "set exactly one of claimName or hostPath",
            ),
            cel(
                f"!has(self.mountPath) || self.mountPath != {SCRATCH_MOUNT_PATH!r}",
                f"{SCRATCH_MOUNT_PATH} is the trainer's scratch emptyDir; mount checkpoints "
                "elsewhere",
                field_path=".mountPath",
            ),
            cel(
                f"!has(self.mountPath) || self.mountPath != {REJOIN_MOUNT_PATH!r}",
                f"{REJOIN_MOUNT_PATH} is where the operator tells a trainer to rejoin; mount "
                "checkpoints elsewhere",
                field_path=".mountPath",
            ),
        )
    )

    claim_name: DnsSubdomain | None = Field(
        default=None,
        description="PersistentVolumeClaim to mount (must be ReadWriteMany for multi-host jobs).",
    )
    host_path: str | None = Field(
        default=None,
        max_length=c.MAX_URI_LENGTH,
        pattern=ABSOLUTE_PATH_PATTERN,
        description=(
            "Absolute path on each node (single-machine and test clusters). Refused at "
            "admission unless it lies under a prefix of the operator chart's hostPathPrefixes."
        ),
    )
    mount_path: str = Field(
        default=DEFAULT_CHECKPOINT_MOUNT_PATH,
        max_length=c.MAX_URI_LENGTH,
        pattern=ABSOLUTE_PATH_PATTERN,
        description="Where the volume is mounted in the trainer container.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> CheckpointVolume:
        if (self.claim_name is None) == (self.host_path is None):
            raise ValueError("set exactly one of claimName or hostPath")
        return self

    @field_validator("mount_path")
    @classmethod
    def _not_scratch(cls, path: str) -> str:
        if path == SCRATCH_MOUNT_PATH:
            raise ValueError(
                f"{SCRATCH_MOUNT_PATH} is the trainer's scratch emptyDir; mount checkpoints "
                "elsewhere"
            )
        if path == REJOIN_MOUNT_PATH:
            raise ValueError(
                f"{REJOIN_MOUNT_PATH} is where the operator tells a trainer to rejoin; mount "
                "checkpoints elsewhere"
            )
        return path


class LocalCheckpointSpec(SpecModel):
    """The fast local checkpoint tier: a memory-backed volume on each host."""

    interval_steps: int = Field(
        default=DEFAULT_LOCAL_CHECKPOINT_INTERVAL_STEPS,
        ge=1,
        description=(
            "Save to the local tier every this many steps (the persistent folder keeps "
            "spec.checkpoint.intervalSteps). A training process restarted in its pod restores "
            "from it; a replaced pod from a peer's copy, or the persistent folder."
        ),
    )
    size_limit: Quantity = Field(
        default=DEFAULT_LOCAL_CHECKPOINT_SIZE,
        description=(
            "Size of each pod's memory-backed volume (two steps of one host's state); it "
            "counts against the trainer's memory limit."
        ),
    )


class CheckpointSpec(SpecModel):
    """Where checkpoints live and how often they are taken."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel("has(self.uri) != has(self.volume)", "set exactly one of uri or volume"),
            cel(
                "!has(self.uri) || self.uri.startsWith('gs://')",
                "only Cloud Storage (gs://BUCKET/PATH) is supported; for a local directory "
                "or a PersistentVolumeClaim use spec.checkpoint.volume",
                field_path=".uri",
            ),
        )
    )

    uri: str | None = Field(
        default=None,
        max_length=c.MAX_URI_LENGTH,
        pattern=CHECKPOINT_URI_PATTERN,
        description=(
            "Cloud Storage URI of the checkpoint directory (gs://BUCKET/PATH); a local "
            "directory or a claim is spec.checkpoint.volume."
        ),
    )
    volume: CheckpointVolume | None = Field(
        default=None, description="A volume holding the checkpoint directory, instead of a URI."
    )
    interval_steps: int = Field(
        default=DEFAULT_CHECKPOINT_INTERVAL_STEPS,
        ge=1,
        description="Save a checkpoint every this many steps.",
    )
    keep: int = Field(
        default=DEFAULT_CHECKPOINT_KEEP,
        ge=1,
        le=1000,
        description="Number of most recent checkpoints kept.",
    )
    local: LocalCheckpointSpec | None = Field(
        default=None,
        description=(
            "A fast local tier besides the persistent folder: each pod saves to a "
            "memory-backed volume every local.intervalSteps steps. Off when absent."
        ),
    )

    @field_validator("uri", mode="before")
    @classmethod
    def _cloud_storage(cls, uri: object) -> object:
        # Before the pattern, so a file:// or s3:// URI is told what to use instead.
        if isinstance(uri, str) and not uri.startswith("gs://"):
            raise ValueError(
                "only Cloud Storage (gs://BUCKET/PATH) is supported; for a local directory "
                "or a PersistentVolumeClaim use spec.checkpoint.volume"
            )
        return uri

    @model_validator(mode="after")
    def _one_location(self) -> CheckpointSpec:
        if (self.uri is None) == (self.volume is None):
            raise ValueError("set exactly one of uri or volume")
        return self

    @property
    def directory(self) -> str:
        """The checkpoint directory as the trainer sees it (the URI or the mount path)."""
        if self.uri is not None:
            return self.uri
        assert self.volume is not None  # guaranteed by _one_location
        return self.volume.mount_path


class ElasticSpec(SpecModel):
    """Running on fewer slices than asked rather than waiting for a pool."""

    min_slices: int = Field(
        ge=1,
        le=c.MAX_SLICES,
        description=(
            "The fewest slices the job may train on. When a hard failure leaves no usable pool "
            "for a slice, the next attempt runs on the slices that have one, if they are at "
            "least this many, instead of waiting; when a pool frees, the job restarts on every "
            "slice (both times from the newest checkpoint, every pod new). The trainer keeps "
            "the global batch: it is told the slices asked for in TPUJOB_PLANNED_SLICES and "
            "those of the attempt in MEGASCALE_NUM_SLICES. Only after a failure: a new job "
            "starts on every slice. At most spec.tpu.slices."
        ),
    )


class TPUTrainingJobSpec(SpecModel):
    """The desired state of a TPU training run."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            topology_cel.failed_node_budget_rule(),
            cel(
                "!has(self.checkpoint) || !has(self.checkpoint.volume) || "
                "!has(self.trainer.volumeMounts) || self.trainer.volumeMounts.all(m, "
                "m.mountPath != self.checkpoint.volume.mountPath)",
                "the checkpoint volume is mounted there (spec.checkpoint.volume.mountPath)",
                field_path=".trainer.volumeMounts",
            ),
            cel(
                "!has(self.elastic) || self.elastic.minSlices <= "
                "(has(self.tpu.slices) ? self.tpu.slices : 1)",
                "elastic.minSlices may be at most spec.tpu.slices",
                field_path=".elastic.minSlices",
            ),
        )
    )

    framework: Framework = Field(
        default=Framework.JAX, description="Training framework of the trainer."
    )
    tpu: TPUSpec = Field(description="The TPU slices to run on.")
    trainer: TrainerSpec = Field(description="The trainer container.")
    checkpoint: CheckpointSpec | None = Field(
        default=None,
        description="Checkpointing; without it a restarted job starts again from step 0.",
    )
    recovery: RecoverySpec = Field(
        default_factory=RecoverySpec,
        description="Failure recovery policy and budgets.",
        json_schema_extra={"default": {}},
    )
    elastic: ElasticSpec | None = Field(
        default=None,
        description=(
            "Let a multislice job train on fewer slices while a pool is missing after a hard "
            "failure; without it the job waits for a pool for every slice."
        ),
    )
    suspend: bool = Field(
        default=False,
        description=(
            "True stops the workers (checkpointing first) and keeps the job; false resumes."
        ),
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Delete the job this many seconds after it succeeded or failed.",
    )

    @model_validator(mode="after")
    def _failed_node_budget_in_range(self) -> TPUTrainingJobSpec:
        budget = self.recovery.max_failed_nodes
        if isinstance(budget, int) and 2 * budget > self.tpu.total_hosts + 1:
            raise ValueError(
                f"maxFailedNodes {budget} is more than half of the job's "
                f"{self.tpu.total_hosts} hosts"
            )
        return self

    @model_validator(mode="after")
    def _checkpoint_mount_is_free(self) -> TPUTrainingJobSpec:
        volume = self.checkpoint.volume if self.checkpoint is not None else None
        if volume is not None and any(
            m.mount_path == volume.mount_path for m in self.trainer.volume_mounts
        ):
            raise ValueError(
                f"spec.trainer.volumeMounts: {volume.mount_path} is where the checkpoint volume "
                "is mounted (spec.checkpoint.volume.mountPath)"
            )
        return self

    @model_validator(mode="after")
    def _min_slices_within_slices(self) -> TPUTrainingJobSpec:
        if self.elastic is not None and self.elastic.min_slices > self.tpu.slices:
            raise ValueError(
                f"elastic.minSlices {self.elastic.min_slices} is more than the job's "
                f"{self.tpu.slices} slices"
            )
        return self

    def max_failed_nodes_count(self) -> int:
        """The failed-node budget of this job as a node count."""
        return self.recovery.max_failed_nodes_count(self.tpu.total_hosts)
