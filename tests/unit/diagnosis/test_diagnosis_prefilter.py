"""The literal pre-check only skips regexes that cannot match."""

from __future__ import annotations

import pytest

from tpujob.diagnosis import default_rule_table
from tpujob.diagnosis.prefilter import required_literals
from tpujob.diagnosis.rules import Haystack

CASES = [
    ("Device or resource busy", {"device or resource busy"}),
    (
        "(Unable to initialize backend|Requested backend)\\W+x",
        {"unable to initialize backend", "requested backend"},
    ),
    ("(ab|cdef)ghij", {"ghij"}),
    ("(abc|d)\\S+", None),
    ("\\d+\\s*", None),
    ("(?:DataLoss)?record", {"record"}),
]


@pytest.mark.parametrize(("pattern", "expected"), CASES, ids=[c[0][:24] for c in CASES])
def test_required_literals(pattern: str, expected: set[str] | None) -> None:
    found = required_literals(pattern)
    assert (None if found is None else set(found)) == expected


def test_optional_groups_are_not_required() -> None:
    assert required_literals("(?:abcdef)?xy") is None


@pytest.mark.parametrize(
    "text",
    [
        "E0101 TPU initialization failed: open(/dev/vfio/0): Device or resource busy",
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space",
        "Gloo all-reduce failed: Connection closed by peer",
        "TypeError: dot_general requires contracting dimensions to have the same shape",
    ],
    ids=["busy", "hbm", "gloo", "shape"],
)
def test_every_table_pattern_that_matches_passes_its_precheck(text: str) -> None:
    table = default_rule_table()
    scanned = table.haystack(text)
    unscanned = Haystack(text, text.lower())
    for rule in table.text_rules:
        for pattern in (*rule.any, *rule.also, *rule.context, *rule.unless):
            if pattern.regex.search(text):
                assert pattern.search(scanned) is not None, rule.name
                assert pattern.search(unscanned) is not None, rule.name
