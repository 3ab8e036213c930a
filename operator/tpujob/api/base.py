"""Shared building blocks of the API models: base classes, CEL rule values, scalar types.

Bottom layer (pydantic and stdlib only). Spec models are strict (unknown fields are errors, as
the apiserver's strict field validation makes them) and status models are lenient (fields an
operator of another version wrote are kept, not rejected). Both are frozen values.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

_COMMON = ConfigDict(
    alias_generator=to_camel,
    validate_by_name=True,
    validate_by_alias=True,
    serialize_by_alias=True,
    frozen=True,
    use_attribute_docstrings=False,
)


class SpecModel(BaseModel):
    """Base of every spec model: camelCase aliases, unknown fields refused."""

    model_config = ConfigDict(**_COMMON, extra="forbid")


class StatusModel(BaseModel):
    """Base of every status model: camelCase aliases, unknown fields kept."""

    model_config = ConfigDict(**_COMMON, extra="allow")


def cel(
    rule: str, message: str, *, field_path: str | None = None, reason: str | None = None
) -> JsonDict:
    """One `x-kubernetes-validations` entry.

    `field_path` (relative to the node carrying the rule, e.g. `.topology`) makes the apiserver
    report the error at that field instead of at the object holding the rule.
    """
    entry: JsonDict = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    if reason is not None:
        entry["reason"] = reason
    return entry


def validations(*rules: JsonDict) -> JsonDict:
    """A json_schema_extra mapping that attaches CEL rules to a field or model."""
    return {"x-kubernetes-validations": list(rules)}


# The Kubernetes resource.Quantity grammar, without a sign: negative resources make no sense.
QUANTITY_PATTERN = (
    r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


def _quantity(value: object) -> object:
    # YAML turns `cpu: 2` into an int; Kubernetes accepts both, so the model does too.
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and not _QUANTITY_RE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes quantity such as 500m, 2, 4Gi")
    return value


Quantity = Annotated[
    str,
    BeforeValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
        }
    ),
]

DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

DnsSubdomain = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
