"""spec.trainer: what runs on every TPU host (image, command, env, host resources, security).

Part of the API layer (pydantic only). Env entries use the Kubernetes EnvVar shape so that
`valueFrom` (secrets, config maps, the downward API) passes through to the pods unchanged.
`security` is deliberately not a Kubernetes SecurityContext: it starts from what Pod Security
`restricted` demands and names only the few things a trainer may need to relax; whatever it
relaxes is still judged by the namespace's Pod Security level when the pods are created.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from tpujob.api import constants as c
from tpujob.api.base import DnsSubdomain, Quantity, SpecModel, cel, validations
from tpujob.api.pod_template import PodTemplate, VolumeMount

RESERVED_ENV_PREFIX = "TPUJOB_"
# The user of the reference trainer images (trainer_image/Dockerfile*: `useradd --uid 1000`).
REFERENCE_IMAGE_UID = 1000
MAX_CAPABILITIES = 16

Arg = Annotated[str, Field(max_length=c.MAX_ARG_LENGTH)]


class EnvVar(SpecModel):
    """One environment variable of the trainer container, in the Kubernetes EnvVar shape."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!(has(self.value) && has(self.valueFrom))",
                "set either value or valueFrom, not both",
                field_path=".valueFrom",
            ),
            cel(
                f"!self.name.startsWith({RESERVED_ENV_PREFIX!r})",
                f"names starting with {RESERVED_ENV_PREFIX} are set by the operator",
                field_path=".name",
            ),
        )
    )

    name: str = Field(
        min_length=1,
        max_length=256,
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        description="Variable name (letters, digits, '_', '-', '.'; not starting with a digit).",
    )
    value: str | None = Field(
        default=None,
        max_length=32768,
        description="Literal value; mutually exclusive with valueFrom.",
    )
    value_from: dict[str, Any] | None = Field(
        default=None,
        description=(
            "Source of the value, passed through unchanged to the pods: secretKeyRef, "
            "configMapKeyRef, fieldRef or resourceFieldRef, as in a Pod's env."
        ),
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        if name.startswith(RESERVED_ENV_PREFIX):
            raise ValueError(f"names starting with {RESERVED_ENV_PREFIX} are set by the operator")
        return name

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set either value or valueFrom, not both")
        return self


class HostResources(SpecModel):
    """CPU and memory each worker pod requests on its TPU host (TPU chips are derived)."""

    cpu: Quantity | None = Field(
        default=None, description="CPU request per worker, a Kubernetes quantity (e.g. 8, 500m)."
    )
    memory: Quantity | None = Field(
        default=None,
        description="Memory request and limit per worker, a Kubernetes quantity (e.g. 64Gi).",
    )


class SeccompProfile(enum.StrEnum):
    """The seccomp profiles a trainer may run under (Localhost profiles are node-specific)."""

    RUNTIME_DEFAULT = "RuntimeDefault"
    UNCONFINED = "Unconfined"


Capability = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Z][A-Z_]*$")]


class TrainerSecurity(SpecModel):
    """How the trainer container runs. The defaults pass Pod Security `restricted`."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.runAsUser) || self.runAsUser != 0 || "
                "(has(self.allowRoot) && self.allowRoot)",
                "runAsUser 0 is root; set allowRoot to run the trainer as root",
                field_path=".runAsUser",
            )
        )
    )

    run_as_user: int = Field(
        default=REFERENCE_IMAGE_UID,
        ge=0,
        le=2**31 - 1,
        description=(
            "UID of the trainer's processes; 1000 is the user of the reference trainer images."
        ),
    )
    run_as_group: int = Field(
        default=REFERENCE_IMAGE_UID, ge=0, le=2**31 - 1, description="GID of the processes."
    )
    fs_group: int = Field(
        default=REFERENCE_IMAGE_UID,
        ge=0,
        le=2**31 - 1,
        description=(
            "Group that owns volumes which support ownership management (persistent disks), "
            "so a non-root trainer can write its checkpoints."
        ),
    )
    allow_root: bool = Field(
        default=False,
        description=(
            "Let the image run as root (runAsNonRoot false). Pod Security restricted refuses it."
        ),
    )
    read_only_root_filesystem: bool = Field(
        default=True,
        description=(
            "Mount the image read-only; /tmp is an emptyDir either way. False for trainers "
            "that write into their image."
        ),
    )
    add_capabilities: tuple[Capability, ...] = Field(
        default=(),
        max_length=MAX_CAPABILITIES,
        description=(
            "Linux capabilities added back after dropping all (e.g. IPC_LOCK). Pod Security "
            "restricted allows only NET_BIND_SERVICE."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    seccomp_profile: SeccompProfile = Field(
        default=SeccompProfile.RUNTIME_DEFAULT,
        description="Seccomp profile of the pod; restricted allows RuntimeDefault only here.",
    )

    @model_validator(mode="after")
    def _root_is_explicit(self) -> TrainerSecurity:
        if self.run_as_user == 0 and not self.allow_root:
            raise ValueError("runAsUser 0 is root; set allowRoot to run the trainer as root")
        return self


class TrainerSpec(SpecModel):
    """The trainer container run on every host of every slice."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.podTemplate) && "
                "has(self.podTemplate.spec) && has(self.podTemplate.spec.volumes) && "
                "self.podTemplate.spec.volumes.exists(v, v.name == m.name))",
                "every volume mount names a volume of spec.trainer.podTemplate.spec.volumes",
                field_path=".volumeMounts",
            )
        )
    )

    image: str = Field(min_length=1, max_length=512, description="Container image of the trainer.")
    command: tuple[Arg, ...] | None = Field(
        default=None,
        max_length=c.MAX_ARGS,
        description="Entrypoint; the image's entrypoint when omitted.",
    )
    args: tuple[Arg, ...] | None = Field(
        default=None, max_length=c.MAX_ARGS, description="Arguments to the entrypoint."
    )
    env: tuple[EnvVar, ...] = Field(
        default=(),
        max_length=c.MAX_ENV,
        description=(
            "Extra environment variables. The operator sets the TPUJOB_* variables and the "
            "framework's coordination variables itself."
        ),
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    resources: HostResources | None = Field(
        default=None, description="Host CPU and memory per worker pod."
    )
    service_account_name: DnsSubdomain | None = Field(
        default=None, description="ServiceAccount the worker pods run as."
    )
    allow_cpu_fallback: bool = Field(
        default=False,
        description=(
            "Accept a CPU backend when the TPU is not usable. False (the default) makes a "
            "trainer that asked for TPUs and got CPUs fail as a configuration error."
        ),
    )
    total_steps: int | None = Field(
        default=None, ge=1, description="Steps the run is expected to take, for progress reporting."
    )
    termination_grace_period_seconds: int = Field(
        default=30,
        ge=1,
        le=3600,
        description=(
            "Seconds a trainer has after SIGTERM (maintenance, preemption, a graceful stop) to "
            "save its checkpoint before it is killed; a large model's save may need minutes."
        ),
    )
    security: TrainerSecurity = Field(
        default_factory=TrainerSecurity,
        description=(
            "User, groups, root filesystem and capabilities of the trainer. The defaults pass "
            "Pod Security restricted; relaxing them is judged by the namespace's level."
        ),
        json_schema_extra={"default": {}},
    )

    volume_mounts: tuple[VolumeMount, ...] = Field(
        default=(),
        max_length=c.MAX_TEMPLATE_ITEMS,
        description="Volumes of spec.trainer.podTemplate mounted into the trainer container.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["mountPath"],
        },
    )
    pod_template: PodTemplate | None = Field(
        default=None,
        description=(
            "Labels, annotations, tolerations, node selectors, priority, volumes, host "
            "networking and pull secrets added to every worker pod; the operator's own fields "
            "cannot be named."
        ),
    )

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> TrainerSpec:
        volumes = {v.name for v in self.pod_template.spec.volumes} if self.pod_template else set()
        for mount in self.volume_mounts:
            if mount.name not in volumes:
                raise ValueError(
                    f"volume mount {mount.mount_path} names {mount.name!r}, which is not a "
                    "volume of spec.trainer.podTemplate.spec.volumes"
                )
        paths = [m.mount_path for m in self.volume_mounts]
        if len(set(paths)) != len(paths):
            raise ValueError("volume mount paths must be unique")
        return self

    @field_validator("env")
    @classmethod
    def _unique_names(cls, env: tuple[EnvVar, ...]) -> tuple[EnvVar, ...]:
        names = [e.name for e in env]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate env names: {', '.join(duplicates)}")
        return env
