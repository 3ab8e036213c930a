"""spec.trainer: what runs on every TPU host (image, command, env, host resources).

Part of the API layer (pydantic only). Env entries use the Kubernetes EnvVar shape so that
`valueFrom` (secrets, config maps, the downward API) passes through to the pods unchanged.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from tpujob.api import constants as c
from tpujob.api.base import DnsSubdomain, Quantity, SpecModel, cel, validations

RESERVED_ENV_PREFIX = "TPUJOB_"

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


class TrainerSpec(SpecModel):
    """The trainer container run on every host of every slice."""

    image: str = Field(
        min_length=1, max_length=512, description="Container image of the trainer."
    )
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
        default=None,
        ge=1,
        description="Steps the run is expected to take, for progress reporting.",
    )

    @field_validator("env")
    @classmethod
    def _unique_names(cls, env: tuple[EnvVar, ...]) -> tuple[EnvVar, ...]:
        names = [e.name for e in env]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate env names: {', '.join(duplicates)}")
        return env
