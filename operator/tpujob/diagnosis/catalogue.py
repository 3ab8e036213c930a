"""Catalogues: the documented vocabularies a failure speaks in, one data file each.

A rule written from a report knows that report's words; a catalogue is enumerated from the
documentation of one vocabulary (Kubernetes reasons, NVIDIA Xid codes, gRPC status codes,
Python's exceptions, ...), so it also knows the failures nobody has reported to us yet. Each
entry says which mechanism it names, what the vocabulary's own documentation says it
means, the class it gets and why, and where that is documented; `examples` are messages
as the documentation shows them, which a table test grades.

An entry matches in one of four ways: regexes (`any`, `also`, `context`, `unless`, as in
`rules.yaml`, compiled with RE2), the type name of the last exception a traceback raised
(`raised`), the canonical status word that exception wraps (`status`), or the HTTP status
it carries (`http`: codes, or ranges `500-599`). Regex entries are tried after the rule
table's text rules; the other three grade what the exception layer finds (`exceptions.py`).
Loading validates every entry (unknown keys, classes, codes, statuses, patterns RE2
refuses), so a broken catalogue fails at the first load, which a unit test does. Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from tpujob.diagnosis.rules import (
    RuleTable,
    RuleTableError,
    TextRule,
    Verdict,
    compile_pattern,
    default_rule_table,
    parse_verdict,
    with_catalogue_rules,
)

# Tried in this order: device and node faults before the programs that report them.
CATALOGUES = (
    "gpu_xid",
    "kernel",
    "gke_tpu",
    "kubernetes",
    "slurm",
    "kubelet_runtime",
    "collectives",
    "cuda",
    "xla_jax",
    "torch_tf",
    "ray",
    "storage_http",
    "python",
    "grpc_status",
)
RESOURCE = "catalogue_{}.yaml"

STATUS_WORDS = frozenset(
    {
        "UNAVAILABLE",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "CANCELLED",
        "RESOURCE_EXHAUSTED",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "NOT_FOUND",
        "UNIMPLEMENTED",
        "ALREADY_EXISTS",
        "OUT_OF_RANGE",
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "DATA_LOSS",
        "INTERNAL",
        "UNKNOWN",
    }
)
# What the exception layer recognises as a raised type's name (`exceptions.py`).
EXCEPTION_SUFFIXES = ("Error", "Exception", "Exit", "Interrupt", "Timeout")
_META_KEYS = {"name", "mechanism", "meaning", "why", "documented", "examples"}
_MATCH_KEYS = {"any", "also", "context", "unless", "raised", "status", "http"}
_VERDICT_KEYS = {"class", "code", "confidence", "summary", "action", "advice", "consequence"}


@dataclass(frozen=True)
class Entry:
    """One documented term of a vocabulary and the verdict it carries."""

    catalogue: str
    name: str
    mechanism: str
    meaning: str
    why: str
    documented: str
    verdict: Verdict
    text: TextRule | None = None
    raised: frozenset[str] = frozenset()
    statuses: frozenset[str] = frozenset()
    http: tuple[range, ...] = ()
    examples: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """`catalogue/name`: how a diagnosis names the entry that decided it."""
        return f"{self.catalogue}/{self.name}"


@dataclass(frozen=True)
class Catalogue:
    name: str
    title: str
    source: str
    entries: tuple[Entry, ...]


def _strings(entry: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = entry.get(key, ())
    if not isinstance(values, list | tuple):
        raise RuleTableError(f"{where}: {key} must be a list")
    return tuple(str(v) for v in values)


def _http_ranges(values: tuple[str, ...], where: str) -> tuple[range, ...]:
    ranges = []
    for value in values:
        low, _, high = value.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError as error:
            raise RuleTableError(f"{where}: http {value!r} is not a code or range") from error
        if not 100 <= first <= last <= 599:
            raise RuleTableError(f"{where}: http {value!r} is outside 100-599")
        ranges.append(range(first, last + 1))
    return tuple(ranges)


def parse_entry(catalogue: str, data: Any, where: str) -> Entry:
    """Validate one catalogue entry."""
    if not isinstance(data, dict) or "name" not in data:
        raise RuleTableError(f"{where}: an entry is a mapping with a name")
    where = f"{where} ({data['name']})"
    unknown = set(data) - _META_KEYS - _MATCH_KEYS - _VERDICT_KEYS
    if unknown:
        raise RuleTableError(f"{where}: unknown keys {sorted(unknown)}")
    missing = {"mechanism", "meaning", "why", "documented", "class", "code"} - set(data)
    if missing:
        raise RuleTableError(f"{where}: missing {sorted(missing)}")
    verdict = parse_verdict({"summary": data["meaning"], **data}, where)
    name = f"{catalogue}/{data['name']}"
    patterns = {k: _strings(data, k, where) for k in ("any", "also", "context", "unless")}
    text = None
    if patterns["any"] or patterns["context"]:
        compiled = {k: tuple(compile_pattern(p, where) for p in v) for k, v in patterns.items()}
        text = TextRule(name, **compiled, verdict=verdict)
    elif patterns["also"] or patterns["unless"]:
        raise RuleTableError(f"{where}: also/unless need `any` or `context` patterns")
    raised = frozenset(_strings(data, "raised", where))
    unseen = sorted(r for r in raised if not r.endswith(EXCEPTION_SUFFIXES))
    if unseen:
        raise RuleTableError(f"{where}: raised {unseen} do not end as exception names do")
    statuses = frozenset(_strings(data, "status", where))
    if not statuses <= STATUS_WORDS:
        raise RuleTableError(f"{where}: unknown status {sorted(statuses - STATUS_WORDS)}")
    entry = Entry(
        catalogue=catalogue,
        name=str(data["name"]),
        mechanism=str(data["mechanism"]),
        meaning=str(data["meaning"]),
        why=str(data["why"]),
        documented=str(data["documented"]),
        verdict=verdict,
        text=text,
        raised=raised,
        statuses=statuses,
        http=_http_ranges(_strings(data, "http", where), where),
        examples=_strings(data, "examples", where),
    )
    if not (entry.text or entry.raised or entry.statuses or entry.http):
        raise RuleTableError(f"{where}: needs patterns, raised, status or http")
    return entry


def parse_catalogue(name: str, data: Any) -> Catalogue:
    """Validate a catalogue document; entry names are unique within it."""
    if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
        raise RuleTableError(f"catalogue {name}: a mapping with a list of entries")
    entries = tuple(
        parse_entry(name, item, f"catalogue {name} entries[{i}]")
        for i, item in enumerate(data["entries"])
    )
    names = [e.name for e in entries]
    if len(names) != len(set(names)):
        raise RuleTableError(f"catalogue {name}: entry names repeat")
    return Catalogue(name, str(data.get("title", name)), str(data.get("source", "")), entries)


@functools.cache
def default_catalogues() -> tuple[Catalogue, ...]:
    """The packaged catalogues, in `CATALOGUES` order, read and validated once."""
    root = resources.files("tpujob.diagnosis")
    return tuple(
        parse_catalogue(name, yaml.safe_load(root.joinpath(RESOURCE.format(name)).read_text()))
        for name in CATALOGUES
    )


@dataclass(frozen=True)
class Lookup:
    """The catalogues indexed for the engine: regex rules in order, the exception tables."""

    text_rules: tuple[TextRule, ...]
    raised: Mapping[str, Entry]
    statuses: Mapping[str, Entry]
    http: tuple[tuple[range, Entry], ...]
    by_key: Mapping[str, Entry]


def index(catalogues: tuple[Catalogue, ...]) -> Lookup:
    """Index catalogues; the first catalogue naming an exception type or status keeps it."""
    entries = [e for c in catalogues for e in c.entries]
    raised: dict[str, Entry] = {}
    statuses: dict[str, Entry] = {}
    for entry in entries:
        for type_name in entry.raised:
            raised.setdefault(type_name, entry)
        for status in entry.statuses:
            statuses.setdefault(status, entry)
    return Lookup(
        text_rules=tuple(e.text for e in entries if e.text is not None),
        raised=raised,
        statuses=statuses,
        http=tuple((r, e) for e in entries for r in e.http),
        by_key={e.key: e for e in entries},
    )


@functools.cache
def default_lookup() -> Lookup:
    return index(default_catalogues())


@functools.cache
def default_table() -> RuleTable:
    """The packaged rule table with the catalogues' regex entries after its text rules."""
    return with_catalogue_rules(default_rule_table(), default_lookup().text_rules)
