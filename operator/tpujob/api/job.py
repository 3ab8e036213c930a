"""The TPUTrainingJob resource as a whole, and reading one from a raw Kubernetes body.

Part of the API layer (pydantic only). `parse_job` is how the operator turns a watch event's
body into a typed job; anything the apiserver admitted but the models refuse (e.g. a pattern
that RE2 accepts and Python's re does not) comes back as an InvalidJobError whose message the
operator puts in the SpecValid condition.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tpujob.api.spec import TPUTrainingJobSpec
from tpujob.api.status import TPUTrainingJobStatus


@dataclass(frozen=True)
class FieldError:
    """One refused field: its path in the body (e.g. spec.tpu.topology) and why."""

    path: str
    message: str


class InvalidJobError(ValueError):
    """A body that is not a valid TPUTrainingJob; carries one FieldError per problem."""

    def __init__(self, errors: tuple[FieldError, ...]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e.path}: {e.message}" for e in errors))


class TPUTrainingJob(BaseModel):
    """A TPUTrainingJob object: apiVersion, kind, metadata, spec and status."""

    # Top-level keys the API machinery may add later are none of the models' business.
    model_config = ConfigDict(extra="ignore", frozen=True, validate_by_name=True)

    api_version: Literal["tpujob.dev/v1alpha1"] = Field(
        default="tpujob.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["TPUTrainingJob"] = Field(default="TPUTrainingJob")
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TPUTrainingJobSpec
    status: TPUTrainingJobStatus = Field(default_factory=TPUTrainingJobStatus)

    @property
    def name(self) -> str:
        """metadata.name ("" when absent)."""
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        """metadata.namespace ("" when absent)."""
        return str(self.metadata.get("namespace", ""))


def _path(loc: tuple[int | str, ...]) -> str:
    # pydantic reports field aliases; list indices become [i] as kubectl prints them.
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def field_errors(error: ValidationError) -> tuple[FieldError, ...]:
    """The errors of a pydantic ValidationError as body paths and messages."""
    return tuple(
        FieldError(_path(tuple(e["loc"])), e["msg"].removeprefix("Value error, "))
        for e in error.errors(include_url=False)
    )


def parse_job(body: Mapping[str, Any]) -> TPUTrainingJob:
    """A typed job from a raw body (a watch event, a YAML document); raises InvalidJobError."""
    try:
        return TPUTrainingJob.model_validate(dict(body))
    except ValidationError as exc:
        raise InvalidJobError(field_errors(exc)) from exc


def parse_status(raw: Mapping[str, Any] | None) -> TPUTrainingJobStatus:
    """The status alone (lenient); an empty status when absent."""
    return TPUTrainingJobStatus.model_validate(dict(raw or {}))
