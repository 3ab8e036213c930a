"""The CustomResourceDefinition of TPUTrainingJob, derived from the models.

Pure functions, no I/O: pydantic's JSON schema is turned into a Kubernetes structural schema
(no $ref, no nullable unions, no titles), keeping descriptions, bounds, enums, defaults and the
CEL rules the models attach. `tpujob.crdgen` writes the result to disk.
"""

from __future__ import annotations

import copy
from typing import Any

from tpujob.api import constants as c
from tpujob.api.base import cel
from tpujob.api.spec import TPUTrainingJobSpec
from tpujob.api.status import TPUTrainingJobStatus

Schema = dict[str, Any]

_RULES = "x-kubernetes-validations"
_INT_OR_STRING = "x-kubernetes-int-or-string"
# JSON Schema keywords Kubernetes does not accept or that say nothing to kubectl explain.
_DROPPED = ("title", "additionalProperties", "$defs")

PRINTER_COLUMNS: tuple[dict[str, str], ...] = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.tpu.accelerator"},
    {"name": "Topology", "type": "string", "jsonPath": ".spec.tpu.topology"},
    {"name": "Slices", "type": "integer", "jsonPath": ".spec.tpu.slices"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts.total"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def _merge(base: Schema, override: Schema) -> Schema:
    """`override` on top of `base`; CEL rules from both are kept (model rules first)."""
    merged = {**base, **override}
    rules = [*base.get(_RULES, []), *override.get(_RULES, [])]
    if rules:
        merged[_RULES] = rules
    return merged


def _structural(node: Schema, defs: Schema, *, defaults: bool) -> Schema:
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        return _structural(_merge(copy.deepcopy(target), rest), defs, defaults=defaults)
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if node.get(_INT_OR_STRING) or any(b.get(_INT_OR_STRING) for b in branches):
            # Kubernetes spells int-or-string as this exact anyOf plus the extension.
            flat: Schema = {}
            for branch in branches:
                flat = _merge(flat, {k: v for k, v in branch.items() if k != "anyOf"})
            node = {**_merge(flat, rest), _INT_OR_STRING: True}
            node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            node.pop("type", None)
        elif len(branches) == 1:
            return _structural(_merge(branches[0], rest), defs, defaults=defaults)
        else:
            raise ValueError(f"union not expressible in a structural schema: {node}")
    out = {k: v for k, v in node.items() if k not in _DROPPED}
    values = node.get("additionalProperties")
    if isinstance(values, dict) and values and "properties" not in node:
        # A map (labels, node selectors): its values' schema, which Kubernetes needs to know
        # that `self` is a map in a CEL rule. (A model's `false` says nothing it would accept.)
        out["additionalProperties"] = _structural(values, defs, defaults=defaults)
    if "default" in out and (not defaults or out["default"] in (None, [], ())):
        del out["default"]
    if "properties" in out:
        out["properties"] = {
            name: _structural(prop, defs, defaults=defaults)
            for name, prop in out["properties"].items()
        }
    if "items" in out:
        out["items"] = _structural(out["items"], defs, defaults=defaults)
    return _ordered(out)


def _ordered(node: Schema) -> Schema:
    # type and description first, the rest alphabetical: stable output that reads top-down.
    head = [k for k in ("type", "description") if k in node]
    return {k: node[k] for k in [*head, *sorted(k for k in node if k not in head)]}


def model_schema(model: type[Any], *, defaults: bool = True) -> Schema:
    """The structural OpenAPI v3 schema of a pydantic model, by alias."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}), defaults=defaults)


def open_api_schema() -> Schema:
    """The openAPIV3Schema of the TPUTrainingJob resource."""
    return {
        "type": "object",
        "description": (
            "A TPU training run: the slices it needs, the trainer to run on every host, where "
            "checkpoints go, and how failures are recovered."
        ),
        "required": ["spec"],
        _RULES: [
            cel(
                f"size(self.metadata.name) <= {c.MAX_JOB_NAME_LENGTH}"
                " && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                f"metadata.name must be a DNS-1035 label of at most {c.MAX_JOB_NAME_LENGTH} "
                "characters (lowercase letters, digits and '-', starting with a letter): worker "
                "pod, host and service names are derived from it",
            )
        ],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "The versioned schema of this object: tpujob.dev/v1alpha1.",
            },
            "kind": {"type": "string", "description": "TPUTrainingJob."},
            "metadata": {"type": "object"},
            "spec": model_schema(TPUTrainingJobSpec),
            # Defaults are the operator's business in status; the schema only describes it.
            "status": model_schema(TPUTrainingJobStatus, defaults=False),
        },
    }


def custom_resource_definition() -> Schema:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": c.CRD_NAME},
        "spec": {
            "group": c.GROUP,
            "names": {
                "kind": c.KIND,
                "listKind": c.LIST_KIND,
                "plural": c.PLURAL,
                "singular": c.SINGULAR,
                "shortNames": list(c.SHORT_NAMES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": c.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(col) for col in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": open_api_schema()},
                }
            ],
        },
    }
