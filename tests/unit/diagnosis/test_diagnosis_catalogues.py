"""The catalogues: every entry documented, every documented example graded by its entry.

The examples are messages as each vocabulary's documentation shows them (not reports from
the corpus). Each must be named by its own entry first within its catalogue, and graded
with the entry's class by the whole engine (rules and catalogues, no model): a rule or an
earlier catalogue that grades it otherwise is a conflict to resolve, not to hide.
"""

from __future__ import annotations

import copy
from importlib import resources
from typing import Any

import pytest
import yaml

from tpujob.diagnosis import FailureClass, RuleTableError, WorkerFacts, diagnose_worker
from tpujob.diagnosis.catalogue import (
    CATALOGUES,
    Catalogue,
    Entry,
    default_catalogues,
    default_table,
    index,
    parse_catalogue,
)
from tpujob.diagnosis.exceptions import grade_exception
from tpujob.diagnosis.rules import TextRule, first_line_match

ENTRIES = [e for c in default_catalogues() for e in c.entries]
EXAMPLES = [(e, text) for e in ENTRIES for text in e.examples]


def _holds(rule: TextRule, text: str) -> bool:
    haystack = default_table().haystack(text)
    return (
        first_line_match(rule.any, haystack) is not None
        and (not rule.also or first_line_match(rule.also, haystack) is not None)
        and not (rule.unless and first_line_match(rule.unless, haystack) is not None)
    )


def first_in_catalogue(catalogue: Catalogue, text: str) -> str | None:
    """The key of the catalogue's entry that names `text` first, as the engine tries them."""
    lookup = index((catalogue,))
    for rule in lookup.text_rules:
        if rule.any and _holds(rule, text):
            return rule.name
    hit = grade_exception(text, lookup)
    return hit.rule if hit is not None else None


def test_every_vocabulary_has_its_catalogue_in_order() -> None:
    assert tuple(c.name for c in default_catalogues()) == CATALOGUES


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.key for e in ENTRIES])
def test_entry_says_mechanism_meaning_why_and_where_documented(entry: Entry) -> None:
    assert entry.mechanism and entry.meaning and entry.why
    assert entry.documented.startswith("https://")
    assert entry.examples, "an entry is tested by at least one documented example"


@pytest.mark.parametrize(
    ("entry", "text"), EXAMPLES, ids=[f"{e.key}:{i}" for i, (e, _) in enumerate(EXAMPLES)]
)
def test_documented_example_is_named_by_its_entry(entry: Entry, text: str) -> None:
    catalogue = next(c for c in default_catalogues() if c.name == entry.catalogue)
    assert first_in_catalogue(catalogue, text) == entry.key


@pytest.mark.parametrize(
    ("entry", "text"), EXAMPLES, ids=[f"{e.key}:{i}" for i, (e, _) in enumerate(EXAMPLES)]
)
def test_documented_example_gets_the_entry_class_from_the_engine(entry: Entry, text: str) -> None:
    diagnosis = diagnose_worker(WorkerFacts(log_tail=text), model=None)
    assert diagnosis.failure_class is entry.verdict.failure_class, diagnosis.rule


def test_text_no_vocabulary_names_is_left_to_the_later_layers() -> None:
    diagnosis = diagnose_worker(WorkerFacts(log_tail="step 41 done; then silence"), model=None)
    assert (diagnosis.rule, diagnosis.failure_class) == ("unknown", FailureClass.MEDIUM)


def packaged(name: str) -> Any:
    path = resources.files("tpujob.diagnosis").joinpath(f"catalogue_{name}.yaml")
    return yaml.safe_load(path.read_text("utf-8"))


def broken(name: str, key: str, value: Any) -> Any:
    data = copy.deepcopy(packaged(name))
    if value is None:
        del data["entries"][0][key]
    else:
        data["entries"][0][key] = value
    return data


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("kernel", broken("kernel", "any", ["(unclosed"])),
        ("kernel", broken("kernel", "any", ["(?<=lookbehind)x"])),
        ("kernel", broken("kernel", "colour", "red")),
        ("kernel", broken("kernel", "documented", None)),
        ("kernel", broken("kernel", "class", "catastrophic")),
        ("grpc_status", broken("grpc_status", "status", ["SLOW"])),
        ("storage_http", broken("storage_http", "http", ["700"])),
        ("storage_http", broken("storage_http", "http", ["4xx"])),
        ("kernel", broken("kernel", "any", [])),
    ],
    ids=[
        "bad-regex",
        "regex-re2-cannot-run",
        "unknown-key",
        "no-documentation",
        "bad-class",
        "unknown-status",
        "http-out-of-range",
        "http-not-a-code",
        "no-matcher",
    ],
)
def test_malformed_catalogue_is_refused_naming_the_entry(name: str, data: Any) -> None:
    with pytest.raises(RuleTableError, match=r"entries\[0\]"):
        parse_catalogue(name, data)


def test_catalogue_with_repeated_entry_names_is_refused() -> None:
    data = packaged("kernel")
    data["entries"].append(copy.deepcopy(data["entries"][0]))
    with pytest.raises(RuleTableError, match="repeat"):
        parse_catalogue("kernel", data)
