"""The packaged rule table is valid, and malformed tables are rejected with a typed error."""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import pytest
import yaml

from tpujob.api import contract
from tpujob.diagnosis import FailureCode, RuleTableError, default_rule_table, parse_rule_table


def packaged() -> Any:
    text = resources.files("tpujob.diagnosis").joinpath("rules.yaml").read_text("utf-8")
    return yaml.safe_load(text)


def test_packaged_table_loads_with_every_layer_and_a_named_default() -> None:
    table = default_rule_table()
    assert table.node_rules and table.text_rules and table.exit_rules
    assert table.default_name == "unknown"
    assert table.default.code is FailureCode.UNKNOWN


def test_rule_names_are_unique() -> None:
    table = default_rule_table()
    names = [r.name for r in table.node_rules]
    names += [r.name for r in table.text_rules]
    names += [r.name for r in table.exit_rules]
    assert len(names) == len(set(names))


def test_every_contract_code_is_a_failure_code() -> None:
    for info in contract.EXIT_CODES.values():
        assert FailureCode(info.code).value == info.code


def broken(path: tuple[str | int, ...], value: Any) -> Any:
    data = copy.deepcopy(packaged())
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    "data",
    [
        broken(("text_rules", 0, "any"), ["(unclosed"]),
        broken(("text_rules", 0, "class"), "catastrophic"),
        broken(("text_rules", 0, "code"), "NOT_A_CODE"),
        broken(("text_rules", 0, "colour"), "red"),
        broken(("node_rules", 0, "signals"), ["moon-phase"]),
        broken(("default",), None),
        broken(
            ("text_rules", 0), {"name": "empty", "class": "soft", "code": "UNKNOWN", "summary": "s"}
        ),
    ],
    ids=[
        "bad-regex",
        "bad-class",
        "bad-code",
        "unknown-key",
        "bad-signal",
        "no-default",
        "no-patterns",
    ],
)
def test_malformed_table_is_rejected(data: Any) -> None:
    with pytest.raises(RuleTableError):
        parse_rule_table(data)
