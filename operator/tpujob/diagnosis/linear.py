"""Linear-time regular expressions: every pattern the diagnosis runs is compiled with RE2.

Logs and user rules are untrusted input. Python's backtracking `re` can take exponential
time on a pattern such as `(a|aa)+$` (and a hand-written built-in can hide such a pattern
too), so the engine compiles every pattern, built-in or from a job's `recovery.rules`, with
RE2, whose matching time is linear in the text. RE2 refuses what it cannot run in linear
time (backreferences, lookaround); that refusal is a typed error naming where the pattern
came from. The apiserver's CEL validates user patterns with the same RE2 syntax, so what
admission accepts the engine runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol, overload

import re2

# RE2 keeps each compiled program within this many bytes; a pattern that needs more is
# refused rather than allowed to grow the operator's memory.
MAX_PROGRAM_BYTES = 8 << 20


class Match(Protocol):
    """What the engine reads from a match."""

    def start(self, group: int = 0) -> int: ...
    def end(self, group: int = 0) -> int: ...
    def group(self, group: int = 0) -> str: ...


class Span(Protocol):
    """Where a match over bytes lies."""

    def start(self, group: int = 0) -> int: ...
    def end(self, group: int = 0) -> int: ...


class Regex(Protocol):
    """A compiled linear-time pattern (the subset of the `re` API the diagnosis uses)."""

    def search(self, text: str) -> Match | None: ...
    @overload
    def finditer(self, text: str) -> Iterator[Match]: ...
    @overload
    def finditer(self, text: bytes) -> Iterator[Span]: ...
    def sub(self, repl: str, text: str) -> str: ...


class UnsafePatternError(ValueError):
    """A pattern RE2 cannot compile (not linear-time, or malformed); names its origin."""

    def __init__(self, where: str, pattern: str, reason: str) -> None:
        super().__init__(f"{where}: {pattern!r} is not a valid RE2 pattern: {reason}")
        self.where = where
        self.pattern = pattern
        self.reason = reason


def _options(*, ignore_case: bool) -> Any:
    options = re2.Options()
    options.case_sensitive = not ignore_case
    options.log_errors = False  # the error is raised to the caller, not printed
    options.max_mem = MAX_PROGRAM_BYTES
    return options


def compile_linear(pattern: str, *, where: str, ignore_case: bool = True) -> Regex:
    """Compile `pattern` with RE2, multi-line (`^`/`$` at line ends), case-insensitive.

    Raises `UnsafePatternError` naming `where` when RE2 refuses the pattern.
    """
    try:
        regex: Regex = re2.compile(f"(?m){pattern}", _options(ignore_case=ignore_case))
    except re2.error as error:
        reason = error.args[0] if error.args else str(error)
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise UnsafePatternError(where, pattern, str(reason)) from error
    except UnicodeEncodeError as error:  # a lone surrogate: RE2 reads UTF-8
        raise UnsafePatternError(
            where, pattern, f"not encodable as UTF-8: {error.reason}"
        ) from error
    return regex


def replace_all(regex: Regex, replacement: str, text: str) -> str:
    """`regex.sub(replacement, text)` for a replacement with no group references, faster.

    RE2 matches UTF-8 bytes; on a `str` its Python wrapper converts every match's byte
    offsets back to character offsets and expands the replacement as a template, which
    costs more than the match itself when a text has hundreds of matches (numbers in a
    log). Matching the encoded text once and joining bytes gives the same text.
    """
    encoded = text.encode("utf-8")
    pieces: list[bytes] = []
    end = 0
    for found in regex.finditer(encoded):
        pieces.append(encoded[end : found.start()])
        end = found.end()
    if not pieces:
        return text
    pieces.append(encoded[end:])
    return replacement.encode("utf-8").join(pieces).decode("utf-8")


class LiteralSet:
    """Which of a fixed collection of literal strings occur in a text, found in one pass.

    Asking `literal in text` for each of a rule table's ~300 literals reads the text ~300
    times (about 10 ms on a 64 KB log); an RE2 set reads it once, whatever the count. The
    match is case-sensitive: callers look for lower-case literals in lower-cased text, as a
    plain `in` would. RE2's set matcher is a DFA with a memory budget, and when the budget
    runs out it reports no match rather than an error, which must not read as "none of them
    present": the first pattern matches every text, so a result without it means the scan
    failed, and `present` then answers None.
    """

    def __init__(self, literals: Iterable[str]) -> None:
        self.literals = tuple(sorted(set(literals)))
        self._set: Any = re2.Set.SearchSet(_options(ignore_case=False))
        self._set.Add("")  # the sentinel, index 0
        for literal in self.literals:
            self._set.Add(re2.escape(literal))
        self._set.Compile()
        self.scanned = frozenset(self.literals)

    def present(self, text: str) -> frozenset[str] | None:
        """The literals that occur in `text`; None if the scan could not be completed."""
        found = self._set.Match(text) or ()
        if 0 not in found:
            return None
        return frozenset(self.literals[i - 1] for i in found if i)
