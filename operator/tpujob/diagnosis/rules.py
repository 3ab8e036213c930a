"""The rule table: typed rules loaded from the packaged `rules.yaml`, and user rules.

The table is data so that a reviewer reads the mechanisms in one place and a change to a
pattern is a change to one line of YAML, not to code; loading validates every entry into
frozen dataclasses (unknown keys, classes, codes and patterns RE2 refuses are errors), so a broken
table fails at the first load, which a unit test does. Rules only match here; the engine
decides in which order the layers are tried.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

import yaml

from tpujob.diagnosis.linear import LiteralSet, Match, Regex, UnsafePatternError, compile_linear
from tpujob.diagnosis.model import Confidence, FailureClass, FailureCode
from tpujob.diagnosis.prefilter import required_literals

TABLE_RESOURCE = "rules.yaml"


class RuleTableError(ValueError):
    """The rule table (packaged or user-supplied) is malformed."""


class NodeSignal(enum.StrEnum):
    """Conditions the engine derives from node, pod, scheduler and heartbeat facts."""

    ACCELERATOR_UNHEALTHY = "accelerator-unhealthy"
    TPU_ALLOCATABLE_DROPPED = "tpu-allocatable-dropped"
    NODE_GONE = "node-gone"
    NODE_OUT_OF_SERVICE = "node-out-of-service"
    MAINTENANCE = "maintenance"
    MAINTENANCE_SCHEDULED = "maintenance-scheduled"
    NODE_NOT_READY = "node-not-ready"
    NODE_UNREACHABLE = "node-unreachable"
    DISRUPTION_TAINT_MANAGER = "disruption-taint-manager"
    DISRUPTION_PREEMPTION = "disruption-preemption"
    DISRUPTION_EVICTION = "disruption-eviction"
    DISRUPTION_KUBELET = "disruption-kubelet"
    KILLED_BY_SIGNAL = "killed-by-signal"
    PENDING = "pending"
    HEARTBEAT_STALLED = "heartbeat-stalled"


@dataclass(frozen=True)
class Haystack:
    """A text to search, its lower case, and which of a table's literals it holds.

    `present` is what one scan of the text by the table's `LiteralSet` found, for the
    literals in `scanned`; a literal outside them (a user rule's), or every literal when
    the scan was not made or failed (`present` None), is looked for in `lowered` directly.
    """

    text: str
    lowered: str
    present: frozenset[str] | None = None
    scanned: frozenset[str] = frozenset()

    def holds_any(self, literals: frozenset[str]) -> bool:
        if self.present is not None and literals <= self.scanned:
            return not literals.isdisjoint(self.present)
        return any(literal in self.lowered for literal in literals)


@dataclass(frozen=True)
class Pattern:
    """A compiled rule regex and the literals one of which any match contains (if known)."""

    regex: Regex
    literals: frozenset[str] | None

    def search(self, haystack: Haystack) -> Match | None:
        if self.literals is not None and not haystack.holds_any(self.literals):
            return None
        return self.regex.search(haystack.text)


@dataclass(frozen=True)
class Verdict:
    """What a matching rule concludes."""

    failure_class: FailureClass
    code: FailureCode
    confidence: Confidence
    summary: str
    action: str = ""
    advice: str = ""
    consequence: bool = False


@dataclass(frozen=True)
class NodeRule:
    name: str
    signals: frozenset[NodeSignal]
    verdict: Verdict


@dataclass(frozen=True)
class TextRule:
    name: str
    any: tuple[Pattern, ...]
    also: tuple[Pattern, ...]
    context: tuple[Pattern, ...]
    unless: tuple[Pattern, ...]
    verdict: Verdict


@dataclass(frozen=True)
class ExitRule:
    name: str
    reasons: frozenset[str]
    signals: frozenset[int]
    exit_codes: frozenset[int]
    verdict: Verdict


@dataclass(frozen=True)
class RuleTable:
    """The ordered rules of each layer and the one named default."""

    node_rules: tuple[NodeRule, ...]
    text_rules: tuple[TextRule, ...]
    exit_rules: tuple[ExitRule, ...]
    default_name: str
    default: Verdict
    # The catalogues' regex entries (`catalogue.py`), tried after `text_rules`.
    catalogue_rules: tuple[TextRule, ...] = ()
    # Every literal the text rules' pre-checks ask for, scanned for in one pass per text.
    literals: LiteralSet = field(default_factory=lambda: LiteralSet(()), compare=False, repr=False)

    def haystack(self, text: str) -> Haystack:
        """`text` made ready for the text rules: lower-cased and scanned for their literals."""
        lowered = text.lower()
        return Haystack(text, lowered, self.literals.present(lowered), self.literals.scanned)


@dataclass(frozen=True)
class UserRule:
    """A rule from the job's `spec.recovery.rules`; every condition given must hold.

    `message_regex` is searched (case-insensitively) in the termination message and the log
    tail. A rule with no condition at all never matches.
    """

    failure_class: FailureClass
    code: FailureCode | None = None
    exit_codes: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()
    message_regex: str | None = None
    name: str = "user-rule"


_VERDICT_KEYS = {"class", "code", "confidence", "summary", "action", "advice", "consequence"}
_RULE_KEYS = {
    "node_rules": _VERDICT_KEYS | {"name", "signals"},
    "text_rules": _VERDICT_KEYS | {"name", "any", "also", "context", "unless"},
    "exit_rules": _VERDICT_KEYS | {"name", "reasons", "signals", "exit_codes"},
}


def compile_pattern(pattern: str, where: str) -> Pattern:
    """Compile a rule pattern with RE2 (linear time), case-insensitive and multi-line."""
    try:
        regex = compile_linear(pattern, where=where)
    except UnsafePatternError as error:
        raise RuleTableError(str(error)) from error
    return Pattern(regex, required_literals(pattern))


# Distinct user patterns kept compiled, least recently used dropped first. A cluster's jobs
# share a few rule sets; the bound keeps a stream of jobs with ever-new patterns from growing
# the operator's memory.
USER_PATTERNS_KEPT = 256


@functools.lru_cache(maxsize=USER_PATTERNS_KEPT)
def _compiled_user_pattern(pattern: str) -> Pattern:
    return Pattern(compile_linear(pattern, where="user rule"), required_literals(pattern))


def user_pattern(pattern: str, where: str) -> Pattern:
    """A job's rule pattern, compiled once per process and kept (keyed by its text alone, so
    rules of many jobs that share a pattern share one compilation). A refused pattern is not
    kept: each use raises `RuleTableError` naming its own `where`."""
    try:
        return _compiled_user_pattern(pattern)
    except UnsafePatternError as error:
        raise RuleTableError(str(UnsafePatternError(where, pattern, error.reason))) from error


def parse_verdict(entry: Mapping[str, Any], where: str) -> Verdict:
    """The verdict keys of a rule or catalogue entry, validated."""
    try:
        return Verdict(
            failure_class=FailureClass(entry["class"]),
            code=FailureCode(entry["code"]),
            confidence=Confidence(entry.get("confidence", "medium")),
            summary=str(entry["summary"]),
            action=str(entry.get("action", "")),
            advice=str(entry.get("advice", "")),
            consequence=bool(entry.get("consequence", False)),
        )
    except (KeyError, ValueError) as error:
        raise RuleTableError(f"{where}: {error!r}") from error


def _patterns(entry: Mapping[str, Any], key: str, where: str) -> tuple[Pattern, ...]:
    values = entry.get(key, ())
    if not isinstance(values, list | tuple):
        raise RuleTableError(f"{where}: {key} must be a list")
    return tuple(compile_pattern(str(value), where) for value in values)


def _entries(data: Mapping[str, Any], layer: str) -> list[tuple[str, Mapping[str, Any]]]:
    entries = data.get(layer, [])
    if not isinstance(entries, list):
        raise RuleTableError(f"{layer} must be a list")
    out: list[tuple[str, Mapping[str, Any]]] = []
    for index, entry in enumerate(entries):
        where = f"{layer}[{index}]"
        if not isinstance(entry, dict) or "name" not in entry:
            raise RuleTableError(f"{where}: a rule is a mapping with a name")
        unknown = set(entry) - _RULE_KEYS[layer]
        if unknown:
            raise RuleTableError(f"{where} ({entry['name']}): unknown keys {sorted(unknown)}")
        out.append((f"{where} ({entry['name']})", entry))
    return out


def parse_rule_table(data: Any) -> RuleTable:
    """Validate the YAML document of a rule table into typed rules."""
    if not isinstance(data, dict) or not isinstance(data.get("default"), dict):
        raise RuleTableError("the rule table is a mapping with a default rule")
    try:
        node_rules = tuple(
            NodeRule(
                str(entry["name"]),
                frozenset(NodeSignal(s) for s in entry["signals"]),
                parse_verdict(entry, where),
            )
            for where, entry in _entries(data, "node_rules")
        )
        exit_rules = tuple(
            ExitRule(
                str(entry["name"]),
                frozenset(str(r) for r in entry.get("reasons", ())),
                frozenset(int(s) for s in entry.get("signals", ())),
                frozenset(int(c) for c in entry.get("exit_codes", ())),
                parse_verdict(entry, where),
            )
            for where, entry in _entries(data, "exit_rules")
        )
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, RuleTableError):
            raise
        raise RuleTableError(f"malformed node or exit rule: {error!r}") from error
    text_rules = tuple(
        TextRule(
            str(entry["name"]),
            _patterns(entry, "any", where),
            _patterns(entry, "also", where),
            _patterns(entry, "context", where),
            _patterns(entry, "unless", where),
            parse_verdict(entry, where),
        )
        for where, entry in _entries(data, "text_rules")
    )
    for rule in text_rules:
        if not rule.any and not rule.context:
            raise RuleTableError(f"text rule {rule.name}: needs `any` or `context` patterns")
    default = data["default"]
    return RuleTable(
        node_rules=node_rules,
        text_rules=text_rules,
        exit_rules=exit_rules,
        default_name=str(default.get("name", "default")),
        default=parse_verdict(default, "default"),
        literals=_literals(text_rules),
    )


@functools.cache
def default_rule_table() -> RuleTable:
    """The packaged table, read and validated once (it is immutable, so sharing is safe)."""
    text = resources.files("tpujob.diagnosis").joinpath(TABLE_RESOURCE).read_text("utf-8")
    return parse_rule_table(yaml.safe_load(text))


def _literals(rules: Sequence[TextRule]) -> LiteralSet:
    return LiteralSet(
        literal
        for rule in rules
        for pattern in (*rule.any, *rule.also, *rule.context, *rule.unless)
        for literal in pattern.literals or ()
    )


def with_catalogue_rules(table: RuleTable, rules: Sequence[TextRule]) -> RuleTable:
    """The table with the catalogues' regex entries after its own text rules, every
    literal of both scanned for in the one pass per text."""
    extra = tuple(rules)
    return replace(table, catalogue_rules=extra, literals=_literals((*table.text_rules, *extra)))


def first_line_match(patterns: Sequence[Pattern], haystack: Haystack) -> Match | None:
    """The earliest-listed pattern's first match in the haystack's text."""
    for pattern in patterns:
        found = pattern.search(haystack)
        if found:
            return found
    return None


def matched_line(text: str, found: Match, limit: int = 240) -> str:
    """The line holding a match, trimmed for evidence."""
    start = text.rfind("\n", 0, found.start()) + 1
    end = text.find("\n", found.end())
    line = text[start : end if end >= 0 else len(text)].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."
