"""The rules' literal pre-check in one pass, and the last exception found from the end.

Both only skip work: what they find must be what a plain search of the whole text finds.
"""

from __future__ import annotations

import pytest

from tpujob.diagnosis import default_rule_table
from tpujob.diagnosis.exceptions import last_exception
from tpujob.diagnosis.linear import LiteralSet
from tpujob.diagnosis.rules import Haystack


def test_one_literal_scan_finds_what_substring_checks_find() -> None:
    literals = ["device or resource busy", "by peer", "oom", "timed out"]
    scan = LiteralSet(literals)
    text = "e0101 open: device or resource busy; connection closed by peer"
    assert scan.present(text) == frozenset(lit for lit in literals if lit in text)
    assert scan.present("nothing here") == frozenset()


@pytest.mark.parametrize(
    ("haystack", "expected"),
    [
        (Haystack("X busy", "x busy"), True),
        (Haystack("X busy", "x busy", frozenset(), frozenset({"busy"})), False),
        (Haystack("X busy", "x busy", frozenset({"busy"}), frozenset({"busy"})), True),
        (Haystack("X busy", "x busy", frozenset(), frozenset({"other"})), True),
    ],
    ids=["not-scanned", "scanned-absent", "scanned-present", "not-among-scanned"],
)
def test_a_literal_the_scan_did_not_cover_is_looked_for_directly(
    haystack: Haystack, expected: bool
) -> None:
    assert haystack.holds_any(frozenset({"busy"})) is expected


def test_the_table_scans_for_every_literal_its_rules_need() -> None:
    table = default_rule_table()
    needed = {
        literal
        for rule in table.text_rules
        for pattern in (*rule.any, *rule.also, *rule.context, *rule.unless)
        for literal in pattern.literals or ()
    }
    assert needed and table.literals.scanned == needed


def test_the_last_of_many_exceptions_is_the_one_graded() -> None:
    warnings = "E0101 ] UserWarning: deprecated\n" * 300
    raised = last_exception(warnings + "KeyError: 'params'\n" + "I0101 shutting down\n")
    assert raised is not None and raised.line == "KeyError: 'params'"


def test_an_exception_before_the_last_lines_is_still_found() -> None:
    text = "ValueError: bad shape\n" + "x" * 50 + "\n" + "I0101 shutting down\n" * 150
    assert 1_000 < len(text) < 8_000
    raised = last_exception(text)
    assert raised is not None and raised.type_name == "ValueError"
