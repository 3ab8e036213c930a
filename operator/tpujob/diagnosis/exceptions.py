"""The Python exception taxonomy: grade a failure by the last exception a traceback raised.

A traceback's last `Name: message` line is what killed the program; earlier ones are
context ("During handling of the above exception..."). Most builtin exception types say the
program itself is wrong (a TypeError fails the same way on every retry), so they are fatal
unless a transient mechanism explains them, which the text rules, tried before this layer,
already had their chance to show. Wrapper types (RuntimeError, XlaRuntimeError, OSError,
HTTPError, ...) say nothing by their name: they are graded by what they wrap, the gRPC/absl
status word (UNAVAILABLE, DEADLINE_EXCEEDED, ...) or the HTTP status they carry. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpujob.diagnosis.catalogue import EXCEPTION_SUFFIXES, Lookup, default_lookup
from tpujob.diagnosis.linear import compile_linear
from tpujob.diagnosis.rules import Verdict

# `pkg.mod.NameError: message` at a line start (or after a log prefix such as `E ... ] `).
_EXCEPTION = compile_linear(
    r"(?:^|[\s(>|\]])(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:"
    + "|".join(EXCEPTION_SUFFIXES)
    + r"))(?::|\s*$)",
    where="built-in exception pattern",
    ignore_case=False,
)
_STATUS = compile_linear(
    r"\b(UNAVAILABLE|DEADLINE_EXCEEDED|ABORTED|CANCELLED|RESOURCE_EXHAUSTED|INVALID_ARGUMENT"
    r"|FAILED_PRECONDITION|NOT_FOUND|UNIMPLEMENTED|ALREADY_EXISTS|OUT_OF_RANGE|PERMISSION_DENIED"
    r"|UNAUTHENTICATED|DATA_LOSS|Unavailable|DeadlineExceeded|Aborted|Cancelled|ResourceExhausted"
    r"|InvalidArgument|FailedPrecondition|NotFound|Unimplemented|AlreadyExists|OutOfRange"
    r"|PermissionDenied|Unauthenticated|DataLoss)\b:",
    where="built-in status pattern",
    ignore_case=False,
)
_HTTP = compile_linear(
    r"\b([1-5]\d\d) (?:Client|Server) Error|(?:status|response code|HTTP)\W{0,3}([1-5]\d\d)\b",
    where="built-in HTTP status pattern",
)
# How far back from the end a traceback's last exception is looked for.
TAIL_CHARS = 8_000
# Where it is looked for first: the last exception is nearly always in the last lines, and a
# log of repeated warnings can hold hundreds of `Name:` lines before it, each a match object.
FIRST_LOOK_CHARS = 1_000


def _canonical(word: str) -> str:
    """`DeadlineExceeded` (TensorFlow's spelling) -> `DEADLINE_EXCEEDED`."""
    if word.isupper():
        return word
    snake = "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(word))
    return snake.upper()


@dataclass(frozen=True)
class Raised:
    """The last exception of a traceback: its type name and the rest of its line."""

    type_name: str
    line: str


def last_exception(text: str) -> Raised | None:
    """The last `Type: message` line of the text's tail, if any."""
    tail = text[-TAIL_CHARS:]
    # The last lines first, from a line start (so `^` holds there as in the whole tail);
    # only when they hold no exception is the whole tail read.
    first_look = tail.rfind("\n", 0, max(0, len(tail) - FIRST_LOOK_CHARS)) + 1
    for start in dict.fromkeys((first_look, 0)):
        found = None
        for found in _EXCEPTION.finditer(tail[start:]):  # noqa: B007 - the last one is wanted
            pass
        if found is not None:
            line = tail[start:]
            end = line.find("\n", found.end())
            return Raised(found.group(1), line[found.start(1) : end if end >= 0 else None].strip())
    return None


def status_of(text: str) -> str | None:
    found = _STATUS.search(text)
    return _canonical(found.group(1)) if found else None


def http_status_of(text: str) -> int | None:
    found = _HTTP.search(text)
    if found is None:
        return None
    return int(found.group(1) or found.group(2))


@dataclass(frozen=True)
class ExceptionHit:
    rule: str
    verdict: Verdict
    detail: str


def grade_exception(text: str, lookup: Lookup | None = None) -> ExceptionHit | None:
    """Grade the text by its last raised exception and what it wraps; None if it says nothing.

    The tables are the catalogues' `raised`, `status` and `http` entries (`catalogue.py`).
    """
    tables = lookup if lookup is not None else default_lookup()
    raised = last_exception(text)
    if raised is not None:
        entry = tables.raised.get(raised.type_name)
        if entry is not None:
            return ExceptionHit(entry.key, entry.verdict, raised.line[:240])
    scope = raised.line if raised is not None else text[-TAIL_CHARS:]
    status = status_of(scope)
    if status is not None and status in tables.statuses:
        detail = raised.line[:240] if raised else f"status {status}"
        entry = tables.statuses[status]
        return ExceptionHit(entry.key, entry.verdict, detail)
    code = http_status_of(scope)
    if code is not None:
        for codes, entry in tables.http:
            if code in codes:
                return ExceptionHit(entry.key, entry.verdict, f"HTTP status {code}")
    return None
