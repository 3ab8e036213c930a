"""spec.trainer.podTemplate and spec.trainer.volumeMounts: what a user adds to every worker pod.

Part of the API layer (pydantic only). A typed subset of a Pod, not a whole PodTemplateSpec:
what TPU users on GKE set (reservations and spot through node selectors and tolerations,
priority, labels and annotations for their own tooling, /dev/shm in memory, the Cloud Storage
FUSE CSI driver, host networking for multislice DCN traffic, pull secrets). The operator's own
fields win: every name the operator writes (its labels and annotations, the node selectors that
pick the pool, its volumes and mount paths) is refused at admission, so a template never
silently loses a value. hostPath volumes are not offered: a node directory is shared with every
other tenant's pods, and the one the operator does mount (spec.checkpoint.volume.hostPath) is
judged by the chart's hostPathPrefixes.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from tpujob.api import constants as c
from tpujob.api.base import DnsSubdomain, Quantity, SpecModel, cel, validations

RESERVED_KEY_PREFIX = f"{c.GROUP}/"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# The node selectors the operator sets: the slice's shape and the pool picked per attempt. A
# hostname would pin a slice to nodes a hard failure must be able to move it off.
RESERVED_NODE_SELECTORS = (
    "cloud.google.com/gke-tpu-accelerator",
    "cloud.google.com/gke-tpu-topology",
    "cloud.google.com/gke-nodepool",
    "kubernetes.io/hostname",
)
RESERVED_VOLUMES = (
    c.SCRATCH_VOLUME,
    c.REJOIN_VOLUME,
    c.CHECKPOINT_VOLUME,
    c.LOCAL_CHECKPOINT_VOLUME,
)
RESERVED_MOUNT_PATHS = (c.SCRATCH_MOUNT_PATH, c.REJOIN_MOUNT_PATH, c.LOCAL_CHECKPOINT_MOUNT_PATH)
MAX_ANNOTATION_VALUE = 4096

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_QUALIFIED_NAME = re.compile(
    rf"^(?:(?P<prefix>{_DNS_LABEL}(\.{_DNS_LABEL})*)/)?"
    r"(?P<name>[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$"
)
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

DnsLabel = Annotated[str, Field(min_length=1, max_length=63, pattern=rf"^{_DNS_LABEL}$")]
LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
AnnotationValue = Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE)]
FileMode = Annotated[int, Field(ge=0, le=0o777)]


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(repr(v) for v in values) + "]"


def qualified_name_error(key: str) -> str | None:
    """Why `key` is not a Kubernetes qualified name (a label, annotation or selector key)."""
    match = _QUALIFIED_NAME.match(key)
    if match is None:
        return (
            f"{key!r} is not a qualified name: an optional DNS subdomain prefix and '/', then "
            "letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        )
    prefix, name = match.group("prefix"), match.group("name")
    if len(name) > 63:
        return f"{key!r}: the name after the prefix is longer than 63 characters"
    if prefix is not None and len(prefix) > 253:
        return f"{key!r}: the prefix is longer than 253 characters"
    return None


def _operator_keys(what: str) -> JsonDict:
    return validations(
        cel(
            f"self.all(k, !k.startsWith({RESERVED_KEY_PREFIX!r}) && k != {MANAGED_BY_LABEL!r})",
            f"{what} under {RESERVED_KEY_PREFIX} and {MANAGED_BY_LABEL} are the operator's",
        )
    )


def _check_keys(keys: list[str], what: str) -> None:
    for key in keys:
        if error := qualified_name_error(key):
            raise ValueError(error)
        if key.startswith(RESERVED_KEY_PREFIX) or key == MANAGED_BY_LABEL:
            raise ValueError(
                f"{what} under {RESERVED_KEY_PREFIX} and {MANAGED_BY_LABEL} are the operator's"
            )


class PodMetadata(SpecModel):
    """Labels and annotations added to every worker pod."""

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=c.MAX_TEMPLATE_ITEMS,
        description="Labels of the worker pods, besides the operator's own (tpujob.dev/*).",
        json_schema_extra=_operator_keys("labels"),
    )
    annotations: dict[str, AnnotationValue] = Field(
        default_factory=dict,
        max_length=c.MAX_TEMPLATE_ITEMS,
        description="Annotations of the worker pods, besides the operator's own (tpujob.dev/*).",
        json_schema_extra=_operator_keys("annotations"),
    )

    @field_validator("labels")
    @classmethod
    def _label_keys(cls, labels: dict[str, str]) -> dict[str, str]:
        _check_keys(list(labels), "labels")
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, annotations: dict[str, str]) -> dict[str, str]:
        _check_keys(list(annotations), "annotations")
        return annotations


class TolerationOperator(enum.StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(enum.StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(SpecModel):
    """A taint the worker pods tolerate, in the Kubernetes Toleration shape."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                f"!self.key.startsWith({RESERVED_KEY_PREFIX!r})",
                f"taints under {RESERVED_KEY_PREFIX} mark nodes the operator found broken; "
                "a trainer may not tolerate them",
                field_path=".key",
            ),
            cel(
                "!has(self.value) || !has(self.operator) || self.operator != 'Exists'",
                "operator Exists matches any value; leave value out",
                field_path=".value",
            ),
            cel(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerationSeconds applies only to effect NoExecute",
                field_path=".tolerationSeconds",
            ),
        )
    )

    key: str = Field(
        min_length=1,
        max_length=317,
        description=(
            "Taint key. Required: a toleration of every key would also tolerate the taint the "
            "operator puts on broken nodes."
        ),
    )
    operator: TolerationOperator = Field(
        default=TolerationOperator.EQUAL, description="Equal (the default) or Exists."
    )
    value: LabelValue | None = Field(default=None, description="Taint value, with Equal.")
    effect: TaintEffect | None = Field(
        default=None, description="Taint effect to tolerate; every effect when omitted."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=c.MAX_SECONDS,
        description="How long a NoExecute taint is tolerated before the pod is evicted.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if error := qualified_name_error(self.key):
            raise ValueError(error)
        if self.key.startswith(RESERVED_KEY_PREFIX):
            raise ValueError(
                f"taints under {RESERVED_KEY_PREFIX} mark nodes the operator found broken; "
                "a trainer may not tolerate them"
            )
        if self.value is not None and self.operator is TolerationOperator.EXISTS:
            raise ValueError("operator Exists matches any value; leave value out")
        if self.toleration_seconds is not None and self.effect is not TaintEffect.NO_EXECUTE:
            raise ValueError("tolerationSeconds applies only to effect NoExecute")
        return self


class EmptyDirMedium(enum.StrEnum):
    DISK = ""
    MEMORY = "Memory"


class EmptyDirSource(SpecModel):
    """Scratch space for the pod's lifetime; medium Memory is a tmpfs (e.g. for /dev/shm)."""

    medium: EmptyDirMedium = Field(
        default=EmptyDirMedium.DISK, description="'' (the node's disk) or Memory (tmpfs)."
    )
    size_limit: Quantity | None = Field(
        default=None, description="Most the volume may hold; Memory counts against the limit."
    )


class ClaimSource(SpecModel):
    """A PersistentVolumeClaim of the job's namespace."""

    claim_name: DnsSubdomain = Field(description="Name of the claim.")
    read_only: bool = Field(default=False, description="Mount the claim read-only.")


class ConfigMapSource(SpecModel):
    """Every key of a ConfigMap of the job's namespace, one file each."""

    name: DnsSubdomain = Field(description="Name of the ConfigMap.")
    optional: bool = Field(default=False, description="Start the pod when it does not exist.")
    default_mode: FileMode | None = Field(default=None, description="Mode of the files.")


class SecretSource(SpecModel):
    """Every key of a Secret of the job's namespace, one file each."""

    secret_name: DnsSubdomain = Field(description="Name of the Secret.")
    optional: bool = Field(default=False, description="Start the pod when it does not exist.")
    default_mode: FileMode | None = Field(default=None, description="Mode of the files.")


class CSISource(SpecModel):
    """An inline CSI volume, such as GKE's Cloud Storage FUSE (gcsfuse.csi.storage.gke.io)."""

    driver: DnsSubdomain = Field(description="Name of the CSI driver.")
    read_only: bool = Field(default=False, description="Mount the volume read-only.")
    volume_attributes: dict[str, Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=dict,
        max_length=c.MAX_TEMPLATE_ITEMS,
        description="Driver attributes (Cloud Storage FUSE: bucketName, mountOptions).",
    )


_SOURCES = ("emptyDir", "persistentVolumeClaim", "configMap", "secret", "csi")


class Volume(SpecModel):
    """A volume of every worker pod, mounted by spec.trainer.volumeMounts."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "[" + ", ".join(f"has(self.{s})" for s in _SOURCES) + "].filter(x, x).size() == 1",
                "set exactly one of " + ", ".join(_SOURCES),
            ),
            cel(
                f"!(self.name in {_cel_list(RESERVED_VOLUMES)})",
                f"volume names {', '.join(RESERVED_VOLUMES)} are the operator's",
                field_path=".name",
            ),
        )
    )

    name: DnsLabel = Field(description="Name of the volume, unique in the pod.")
    empty_dir: EmptyDirSource | None = Field(default=None, description="An emptyDir.")
    persistent_volume_claim: ClaimSource | None = Field(
        default=None, description="A PersistentVolumeClaim."
    )
    config_map: ConfigMapSource | None = Field(default=None, description="A ConfigMap's keys.")
    secret: SecretSource | None = Field(default=None, description="A Secret's keys.")
    csi: CSISource | None = Field(default=None, description="An inline CSI volume.")

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        sources = (
            self.empty_dir,
            self.persistent_volume_claim,
            self.config_map,
            self.secret,
            self.csi,
        )
        if sum(s is not None for s in sources) != 1:
            raise ValueError("set exactly one of " + ", ".join(_SOURCES))
        if self.name in RESERVED_VOLUMES:
            raise ValueError(f"volume names {', '.join(RESERVED_VOLUMES)} are the operator's")
        return self


class VolumeMount(SpecModel):
    """Where a volume of spec.trainer.podTemplate is mounted in the trainer container."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                f"!(self.mountPath in {_cel_list(RESERVED_MOUNT_PATHS)})",
                f"{', '.join(RESERVED_MOUNT_PATHS)} are mounted by the operator",
                field_path=".mountPath",
            )
        )
    )

    name: DnsLabel = Field(description="Name of a volume in spec.trainer.podTemplate.spec.volumes.")
    mount_path: str = Field(
        min_length=2,
        max_length=c.MAX_URI_LENGTH,
        pattern=r"^/[^\s]+$",
        description="Absolute path in the container.",
    )
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: str | None = Field(
        default=None,
        max_length=c.MAX_URI_LENGTH,
        pattern=r"^[^/\s][^\s]*$",
        description="A relative path inside the volume to mount instead of its root.",
    )

    @model_validator(mode="after")
    def _allowed(self) -> VolumeMount:
        if self.mount_path in RESERVED_MOUNT_PATHS:
            raise ValueError(f"{', '.join(RESERVED_MOUNT_PATHS)} are mounted by the operator")
        if self.sub_path is not None and ".." in self.sub_path.split("/"):
            raise ValueError("subPath may not climb out of the volume with '..'")
        return self


class LocalObjectReference(SpecModel):
    """The name of an object in the job's namespace."""

    name: DnsSubdomain = Field(description="Name of the object.")


class PodSpecAdditions(SpecModel):
    """The pod fields a user adds to the operator's."""

    tolerations: tuple[Toleration, ...] = Field(
        default=(),
        max_length=c.MAX_TEMPLATE_ITEMS,
        description=("Taints tolerated besides google.com/tpu (spot, reservations, a team's own)."),
    )
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict,
        max_length=c.MAX_TEMPLATE_ITEMS,
        description=(
            "Node labels the pods also require (e.g. cloud.google.com/gke-spot, "
            "cloud.google.com/reservation-name). The accelerator, topology and pool are the "
            "operator's."
        ),
        json_schema_extra=validations(
            cel(
                f"self.all(k, !(k in {_cel_list(RESERVED_NODE_SELECTORS)}))",
                "the accelerator, topology, node pool and hostname are chosen by the operator "
                "(spec.tpu and its placement)",
            )
        ),
    )
    priority_class_name: DnsSubdomain | None = Field(
        default=None, description="PriorityClass of the pods (quota per class applies)."
    )
    volumes: tuple[Volume, ...] = Field(
        default=(),
        max_length=c.MAX_TEMPLATE_ITEMS,
        description="Volumes of the pods, mounted by spec.trainer.volumeMounts.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    host_network: bool = Field(
        default=False,
        description=(
            "Use the node's network (multislice DCN traffic); the pods then resolve names "
            "with ClusterFirstWithHostNet. Pod Security baseline and restricted refuse it."
        ),
    )
    image_pull_secrets: tuple[LocalObjectReference, ...] = Field(
        default=(),
        max_length=c.MAX_TEMPLATE_ITEMS,
        description="Secrets holding credentials for the trainer image's registry.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("node_selector")
    @classmethod
    def _selectors(cls, selector: dict[str, str]) -> dict[str, str]:
        for key in selector:
            if error := qualified_name_error(key):
                raise ValueError(error)
            if key in RESERVED_NODE_SELECTORS:
                raise ValueError(
                    "the accelerator, topology, node pool and hostname are chosen by the "
                    "operator (spec.tpu and its placement)"
                )
        return selector

    @field_validator("volumes")
    @classmethod
    def _unique_volumes(cls, volumes: tuple[Volume, ...]) -> tuple[Volume, ...]:
        names = [v.name for v in volumes]
        if len(set(names)) != len(names):
            raise ValueError("volume names must be unique")
        return volumes


class PodTemplate(SpecModel):
    """What every worker pod gets besides the operator's own fields, which win."""

    metadata: PodMetadata = Field(
        default_factory=PodMetadata, description="Labels and annotations of the pods."
    )
    spec: PodSpecAdditions = Field(
        default_factory=PodSpecAdditions, description="Pod fields added to the operator's."
    )
