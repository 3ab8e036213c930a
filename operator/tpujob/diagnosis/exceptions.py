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

import enum
from dataclasses import dataclass

from tpujob.diagnosis.linear import compile_linear
from tpujob.diagnosis.model import Confidence, FailureClass, FailureCode
from tpujob.diagnosis.rules import Verdict

# `pkg.mod.NameError: message` at a line start (or after a log prefix such as `E ... ] `).
_EXCEPTION = compile_linear(
    r"(?:^|[\s(>|\]])(?:[A-Za-z_]\w*\.)*([A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::|\s*$)",
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


class Status(enum.StrEnum):
    """The canonical gRPC/absl status codes that grade what they wrap."""

    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    ABORTED = "ABORTED"
    CANCELLED = "CANCELLED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    NOT_FOUND = "NOT_FOUND"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    DATA_LOSS = "DATA_LOSS"


def _canonical(word: str) -> Status:
    """`DeadlineExceeded` (TensorFlow's spelling) -> `DEADLINE_EXCEEDED`."""
    if word.isupper():
        return Status(word)
    snake = "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(word))
    return Status(snake.upper())


def _v(cls: FailureClass, code: FailureCode, summary: str, *, consequence: bool = False) -> Verdict:
    return Verdict(cls, code, Confidence.MEDIUM, summary, consequence=consequence)


_SOFT, _MEDIUM, _FATAL = FailureClass.SOFT, FailureClass.MEDIUM, FailureClass.FATAL
_PEER = _v(
    _SOFT, FailureCode.COLLECTIVE_FAILURE, "a peer or remote runtime went away", consequence=True
)

STATUS_VERDICTS: dict[Status, Verdict] = {
    Status.UNAVAILABLE: _PEER,
    Status.ABORTED: _PEER,
    Status.CANCELLED: _PEER,
    Status.DEADLINE_EXCEEDED: _v(
        _MEDIUM, FailureCode.COLLECTIVE_TIMEOUT, "a remote call or collective timed out"
    ),
    Status.RESOURCE_EXHAUSTED: _v(
        _MEDIUM, FailureCode.RATE_LIMITED, "a quota or resource was exhausted"
    ),
    Status.INVALID_ARGUMENT: _v(
        _FATAL, FailureCode.USER_CODE_ERROR, "the program passed an invalid argument"
    ),
    Status.FAILED_PRECONDITION: _v(
        _FATAL, FailureCode.CONFIG_ERROR, "a precondition of the runtime does not hold"
    ),
    Status.NOT_FOUND: _v(
        _FATAL, FailureCode.CONFIG_ERROR, "something the program needs does not exist"
    ),
    Status.UNIMPLEMENTED: _v(
        _FATAL, FailureCode.USER_CODE_ERROR, "the program asks for something not implemented"
    ),
    Status.ALREADY_EXISTS: _v(
        _FATAL, FailureCode.CONFIG_ERROR, "something the program creates already exists"
    ),
    Status.OUT_OF_RANGE: _v(
        _FATAL, FailureCode.USER_CODE_ERROR, "a value or index is out of range"
    ),
    Status.PERMISSION_DENIED: _v(_FATAL, FailureCode.PERMISSION_DENIED, "access was denied"),
    Status.UNAUTHENTICATED: _v(
        _FATAL, FailureCode.PERMISSION_DENIED, "the credentials were refused"
    ),
    Status.DATA_LOSS: _v(_FATAL, FailureCode.DATA_ERROR, "data was lost or is corrupt"),
}


@dataclass(frozen=True)
class ExceptionRule:
    """Exception type names and the verdict they carry by themselves."""

    name: str
    types: frozenset[str]
    verdict: Verdict


_DETERMINISTIC = frozenset(
    [
        "TypeError",
        "ValueError",
        "KeyError",
        "AttributeError",
        "IndexError",
        "NameError",
        "UnboundLocalError",
        "ZeroDivisionError",
        "AssertionError",
        "SyntaxError",
        "IndentationError",
        "NotImplementedError",
        "RecursionError",
        "ImportError",
        "ModuleNotFoundError",
        "FileNotFoundError",
        "PermissionError",
        "IsADirectoryError",
        "NotADirectoryError",
        "FileExistsError",
        "UnicodeDecodeError",
        "UnicodeEncodeError",
        "JSONDecodeError",
        "LookupError",
        "OverflowError",
        "ScopeParamShapeError",
        "ConcretizationTypeError",
        "TracerBoolConversionError",
        "TracerArrayConversionError",
        "TracerIntegerConversionError",
        "UnexpectedTracerError",
        "InvalidArgumentError",
        "NotFoundError",
        "FailedPreconditionError",
        "UnimplementedError",
        "AlreadyExistsError",
        "PermissionDeniedError",
        "OutOfRangeError",
        "StepAlreadyExistsError",
        "ValidationError",
        "ConfigError",
        "InstantiationException",
        "ConfigAttributeError",
        "MissingMandatoryValue",
    ]
)
EXCEPTION_RULES: tuple[ExceptionRule, ...] = (
    ExceptionRule(
        "exception-peer-went-away",
        frozenset(
            [
                "ConnectionResetError",
                "BrokenPipeError",
                "ConnectionAbortedError",
                "UnavailableError",
                "AbortedError",
                "CancelledError",
            ]
        ),
        _PEER,
    ),
    ExceptionRule(
        "exception-timeout",
        frozenset(
            [
                "TimeoutError",
                "DeadlineExceededError",
                "ReadTimeout",
                "ConnectTimeout",
                "ReadTimeoutError",
                "ConnectTimeoutError",
                "ConnectionRefusedError",
                "ConnectionError",
            ]
        ),
        _v(_MEDIUM, FailureCode.COLLECTIVE_TIMEOUT, "a connection to a peer or service failed"),
    ),
    ExceptionRule(
        "exception-host-memory",
        frozenset({"MemoryError"}),
        _v(_MEDIUM, FailureCode.HOST_OOM, "the process ran out of host memory"),
    ),
    ExceptionRule(
        "exception-deterministic",
        _DETERMINISTIC,
        Verdict(
            _FATAL,
            FailureCode.USER_CODE_ERROR,
            Confidence.MEDIUM,
            "the training program raised an exception",
            advice="fix the error in the training code or its configuration",
        ),
    ),
)

HTTP_VERDICTS: tuple[tuple[range, Verdict], ...] = (
    (
        range(429, 430),
        _v(_MEDIUM, FailureCode.RATE_LIMITED, "a remote service rate-limited the workers"),
    ),
    (range(408, 409), _v(_MEDIUM, FailureCode.STORAGE_UNAVAILABLE, "a remote service timed out")),
    (range(400, 500), _v(_FATAL, FailureCode.CONFIG_ERROR, "a remote service refused the request")),
    (
        range(500, 600),
        _v(_SOFT, FailureCode.STORAGE_UNAVAILABLE, "a remote service failed transiently"),
    ),
)


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


def status_of(text: str) -> Status | None:
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


def grade_exception(text: str) -> ExceptionHit | None:
    """Grade the text by its last raised exception and what it wraps; None if it says nothing."""
    raised = last_exception(text)
    if raised is not None:
        for rule in EXCEPTION_RULES:
            if raised.type_name in rule.types:
                return ExceptionHit(rule.name, rule.verdict, raised.line[:240])
    scope = raised.line if raised is not None else text[-TAIL_CHARS:]
    status = status_of(scope)
    if status is not None:
        detail = raised.line[:240] if raised else f"status {status}"
        return ExceptionHit(
            f"status-{status.lower().replace('_', '-')}", STATUS_VERDICTS[status], detail
        )
    code = http_status_of(scope)
    if code is not None:
        for codes, verdict in HTTP_VERDICTS:
            if code in codes:
                return ExceptionHit(f"http-{code}", verdict, f"HTTP status {code}")
    return None
