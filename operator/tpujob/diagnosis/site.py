"""Site rules: what the people running a cluster know about its failures, as data.

A site rule set is one YAML document (kept by the operator's shell, e.g. in a ConfigMap of
its namespace that only its administrators may edit); the engine takes it as an input and
tries it before the rule table and the catalogues, right after the job's own rules. Each
rule names a class, why, and the date it was set, and matches by either

- `signature`: the signature the engine gave the failure without site rules (what a
  regrade of a job's last failure records), so the same failure anywhere in the cluster
  gets the class; or
- `message_regex` (RE2, searched in the message and log), `exit_codes` and `reasons`, every
  condition given holding, as a job's recovery rules do.

The format:

    version: 1
    rules:
      - name: gcsfuse-nightly-restart
        class: soft
        why: the gcsfuse sidecar restarts every night at 02:00; nothing is broken
        set: 2026-12-01
        set_by: platform-team        # optional
        code: STORAGE_UNAVAILABLE    # optional: the code to report instead of the engine's
        signature: STORAGE_UNAVAILABLE:3f9a0c2d1b7e
        # or: message_regex: 'transport endpoint is not connected', exit_codes: [1]

Pure: parsing validates every field (a pattern RE2 refuses, an unknown class or key, a
missing date are errors naming the rule), so a broken set is refused whole.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tpujob.diagnosis.model import FailureClass, FailureCode
from tpujob.diagnosis.rules import Pattern, RuleTableError, user_pattern

SITE_FORMAT_VERSION = 1
# Where the operator keeps the set (`tpujob regrade` writes it): a ConfigMap in its own
# namespace, editable only by who may edit ConfigMaps there (the cluster's administrators).
SITE_RULES_CONFIGMAP = "tpujob-site-rules"
SITE_RULES_KEY = "rules.yaml"
_KEYS = {
    "name",
    "class",
    "why",
    "set",
    "set_by",
    "code",
    "signature",
    "message_regex",
    "exit_codes",
    "reasons",
}


class SiteRulesError(RuleTableError):
    """The site rule set is malformed."""


@dataclass(frozen=True)
class SiteRule:
    """One regrade the cluster's operators made, with their reason and its date."""

    name: str
    failure_class: FailureClass
    why: str
    set_on: dt.date
    set_by: str = ""
    code: FailureCode | None = None
    signature: str = ""
    message_regex: str | None = None
    exit_codes: tuple[int, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def note(self) -> str:
        """How a diagnosis and `describe` say that this rule decided."""
        return f"site rule '{self.name}', set {self.set_on.isoformat()}: {self.why}"

    @property
    def pattern(self) -> Pattern | None:
        if self.message_regex is None:
            return None
        return user_pattern(self.message_regex, f"site rule {self.name}")


def _date(value: Any, where: str) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError as error:
        raise SiteRulesError(f"{where}: set {value!r} is not a date (YYYY-MM-DD)") from error


def _rule(data: Any, where: str) -> SiteRule:
    if not isinstance(data, dict) or not data.get("name"):
        raise SiteRulesError(f"{where}: a site rule is a mapping with a name")
    where = f"{where} ({data['name']})"
    unknown = set(data) - _KEYS
    if unknown:
        raise SiteRulesError(f"{where}: unknown keys {sorted(unknown)}")
    for key in ("class", "why", "set"):
        if not data.get(key):
            raise SiteRulesError(f"{where}: {key} is required")
    try:
        rule = SiteRule(
            name=str(data["name"]),
            failure_class=FailureClass(data["class"]),
            why=str(data["why"]),
            set_on=_date(data["set"], where),
            set_by=str(data.get("set_by", "")),
            code=FailureCode(data["code"]) if data.get("code") else None,
            signature=str(data.get("signature", "")),
            message_regex=str(data["message_regex"]) if data.get("message_regex") else None,
            exit_codes=tuple(int(c) for c in data.get("exit_codes", ())),
            reasons=tuple(str(r) for r in data.get("reasons", ())),
        )
    except (TypeError, ValueError) as error:
        if isinstance(error, SiteRulesError):
            raise
        raise SiteRulesError(f"{where}: {error}") from error
    if not (rule.signature or rule.message_regex or rule.exit_codes or rule.reasons):
        raise SiteRulesError(f"{where}: needs a signature, message_regex, exit_codes or reasons")
    if rule.signature and (rule.message_regex or rule.exit_codes or rule.reasons):
        raise SiteRulesError(f"{where}: a signature rule matches by the signature alone")
    try:
        rule.pattern  # noqa: B018 - compiled now so that a bad pattern refuses the set
    except RuleTableError as error:
        raise SiteRulesError(str(error)) from error
    return rule


def parse_site_rules(data: Any) -> tuple[SiteRule, ...]:
    """Validate a site rule document; an empty document is an empty set."""
    if data is None:
        return ()
    if not isinstance(data, dict) or not isinstance(data.get("rules", []), list):
        raise SiteRulesError("a site rule set is a mapping with a list of rules")
    version = data.get("version", SITE_FORMAT_VERSION)
    if version != SITE_FORMAT_VERSION:
        raise SiteRulesError(f"site rules format {version}, expected {SITE_FORMAT_VERSION}")
    rules = tuple(_rule(item, f"site rules[{i}]") for i, item in enumerate(data.get("rules", [])))
    names = [r.name for r in rules]
    if len(names) != len(set(names)):
        raise SiteRulesError("site rule names repeat")
    return rules


@dataclass(frozen=True)
class SiteFacts:
    """What a site rule can match: the engine's signature without site rules, the exit
    status, and a search of the worker's message and log for a pattern."""

    signature: str
    exit_code: int | None
    reason: str | None


def first_match(
    rules: Sequence[SiteRule], facts: SiteFacts, search: Callable[[Pattern], str | None]
) -> tuple[SiteRule, str] | None:
    """The first rule that holds, with what it matched; `search(pattern)` returns the
    matched line or None."""
    for rule in rules:
        if rule.signature:
            if rule.signature == facts.signature:
                return rule, f"signature {facts.signature}"
            continue
        if rule.exit_codes and facts.exit_code not in rule.exit_codes:
            continue
        if rule.reasons and facts.reason not in rule.reasons:
            continue
        detail = ", ".join(
            part
            for part in (
                f"exit code {facts.exit_code}" if rule.exit_codes else "",
                f"reason {facts.reason}" if rule.reasons else "",
            )
            if part
        )
        pattern = rule.pattern
        if pattern is not None:
            line = search(pattern)
            if line is None:
                continue
            detail = line
        return rule, detail
    return None
