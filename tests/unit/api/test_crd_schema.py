"""The generated CRD: a structural schema that documents itself and stays within CEL budgets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tpujob.api import topology
from tpujob.api.schema import PRINTER_COLUMNS, custom_resource_definition, open_api_schema

Node = dict[str, Any]


def walk(node: Node, path: str = "") -> Iterator[tuple[str, Node]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")


SCHEMA = open_api_schema()
NODES = list(walk(SCHEMA))


def at(path: str) -> Node:
    return dict(NODES)[path]


@pytest.mark.parametrize("keyword", ["$ref", "$defs", "title", "nullable"], ids=str)
def test_schema_is_structural(keyword: str) -> None:
    assert [p for p, n in NODES if keyword in n] == []


def test_only_maps_have_additional_properties_and_each_says_what_its_values_are() -> None:
    maps = {p: n for p, n in NODES if "additionalProperties" in n}
    assert [p for p, n in maps.items() if "properties" in n] == []
    assert [p for p, n in maps.items() if n["additionalProperties"].get("type") != "string"] == []
    assert any(p.endswith("podTemplate.metadata.labels") for p in maps), sorted(maps)


def test_no_node_is_a_nullable_union() -> None:
    assert [p for p, n in NODES if "null" in str(n.get("anyOf", ""))] == []


def test_every_spec_and_status_field_has_a_description() -> None:
    # Scalar list items are described by their list.
    undocumented = [
        p
        for p, n in NODES
        if p.startswith((".spec", ".status"))
        and not n.get("description")
        and not (p.endswith("[]") and n.get("type") != "object")
    ]
    assert undocumented == []


def test_every_list_is_bounded() -> None:
    unbounded = [p for p, n in NODES if n.get("type") == "array" and "maxItems" not in n]
    assert unbounded == []


@pytest.mark.parametrize(
    ("path", "default"),
    [
        (".spec.framework", "jax"),
        (".spec.tpu.slices", 1),
        (".spec.trainer.allowCpuFallback", False),
        (".spec.recovery", {}),
        (".spec.recovery.autoRecovery", True),
        (".spec.recovery.maxFailedNodes", "20%"),
        (".spec.recovery.backoff", {}),
        (".spec.recovery.backoff.maxSeconds", 300),
        (".spec.recovery.badNodeAction", "taint"),
        (".spec.checkpoint.keep", 3),
        (".spec.trainer.security", {}),
        (".spec.trainer.security.runAsUser", 1000),
        (".spec.trainer.security.allowRoot", False),
        (".spec.trainer.security.readOnlyRootFilesystem", True),
        (".spec.trainer.security.seccompProfile", "RuntimeDefault"),
    ],
    ids=str,
)
def test_schema_carries_the_model_defaults(path: str, default: object) -> None:
    assert at(path)["default"] == default


def test_status_has_no_defaults_the_apiserver_would_add() -> None:
    assert [p for p, n in NODES if p.startswith(".status") and "default" in n] == []


def test_int_or_string_fields_use_the_kubernetes_extension() -> None:
    for path in (".spec.recovery.maxFailedNodes", ".spec.trainer.resources.cpu"):
        node = at(path)
        assert node["x-kubernetes-int-or-string"] is True
        assert "type" not in node


@pytest.mark.parametrize("row", topology.ACCELERATORS, ids=[a.label for a in topology.ACCELERATORS])
def test_each_accelerator_has_a_topology_rule_listing_the_table(row: topology.Accelerator) -> None:
    rules = [r for r in at(".spec.tpu")["x-kubernetes-validations"] if row.label in r["rule"]]
    topology_rule = next(r for r in rules if r.get("fieldPath") == ".topology")
    for topo in row.chips_per_host:
        assert f'"{topo}"' in topology_rule["rule"]
        assert topo in topology_rule["message"]


def test_accelerator_enum_is_the_table() -> None:
    assert at(".spec.tpu.accelerator")["enum"] == list(topology.accelerator_labels())


def test_tpu_fields_have_transition_rules() -> None:
    for field in ("accelerator", "topology", "slices"):
        rules = at(f".spec.tpu.{field}")["x-kubernetes-validations"]
        assert {"rule": "self == oldSelf"}.items() <= rules[0].items()


def test_field_paths_of_rules_name_existing_fields() -> None:
    paths = dict(NODES)
    for path, node in NODES:
        for entry in node.get("x-kubernetes-validations", []):
            if "fieldPath" in entry:
                assert f"{path}{entry['fieldPath']}" in paths, entry


def test_printer_columns_read_fields_of_the_schema() -> None:
    paths = dict(NODES) | {".metadata.creationTimestamp": {}}
    for column in PRINTER_COLUMNS:
        assert column["jsonPath"] in paths, column
    assert [c["name"] for c in PRINTER_COLUMNS] == [
        "Phase",
        "Accelerator",
        "Topology",
        "Slices",
        "Step",
        "Restarts",
        "Age",
    ]


def test_crd_names_and_status_subresource() -> None:
    crd = custom_resource_definition()
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "tputrainingjobs.tpujob.dev"
    assert (spec["group"], spec["scope"]) == ("tpujob.dev", "Namespaced")
    assert spec["names"]["shortNames"] == ["tpujob", "tpujobs"]
    (version,) = spec["versions"]
    assert (version["name"], version["storage"]) == ("v1alpha1", True)
    assert version["subresources"] == {"status": {}}
