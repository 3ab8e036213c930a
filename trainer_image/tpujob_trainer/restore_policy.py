"""When a checkpoint step that fails to read is corrupt, and when it is only unreachable.

Rules used by both training loops' restores (`checkpointing`, `tf_trainer`); only
`read_with_retries` acts (it calls the read it is given and sleeps between tries). A failed
read is one of two things:

* **transient**: the storage did not answer (an `OSError`, a timeout, a gRPC-style status such
  as UNAVAILABLE or DEADLINE_EXCEEDED in a tensorstore error). Nothing is known about the step,
  so it is read again with backoff and, if it still cannot be read, left exactly where it is;
* **corrupt**: the step itself says it is broken (its metadata is missing or does not parse,
  the item orbax wrote is absent, or the bytes do not deserialise). Only this evidence lets a
  step be moved aside.

Anything that is neither an I/O error nor a timeout, raised while deserialising, counts as
evidence: orbax raises `ValueError`/`KeyError`/`UnicodeDecodeError` for bytes it cannot decode.
"""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

# Files orbax writes into every committed step (0.11+): the step's own metadata, and the
# item's metadata inside the item directory. A step without them was never committed whole.
STEP_METADATA = "_CHECKPOINT_METADATA"
ITEM_METADATA = "_METADATA"
ITEM_NAME = "default"

# Status words of transient errors as tensorstore and the object stores spell them.
_TRANSIENT_MARKS = (
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "ABORTED",
    "Connection reset",
    "Connection refused",
    "timed out",
    "Timeout",
    "Input/output error",
    "Stale file handle",
    "Too Many Requests",
    "503",
    # TensorFlow's status errors, by class (their text rarely names the status).
    "UnavailableError",
    "DeadlineExceededError",
    "AbortedError",
)


class ReadFailure(enum.StrEnum):
    """What a failed read of a checkpoint step says about the step."""

    TRANSIENT = "transient"
    CORRUPT = "corrupt"


class Evidence(enum.StrEnum):
    """Why a step is judged corrupt; also the suffix of the name it is moved aside under."""

    MISSING_STEP_METADATA = "missing-step-metadata"
    INVALID_STEP_METADATA = "invalid-step-metadata"
    MISSING_ITEM = "missing-item"
    UNDECODABLE = "undecodable"


def classify_read_error(error: BaseException) -> ReadFailure:
    """Transient for I/O errors and timeouts (by type or by status text), else corrupt."""
    if isinstance(error, OSError | TimeoutError | ConnectionError):
        return ReadFailure.TRANSIENT
    text = f"{type(error).__name__}: {error}"
    if any(mark in text for mark in _TRANSIENT_MARKS):
        return ReadFailure.TRANSIENT
    return ReadFailure.CORRUPT


def judge_step_metadata(read_text: Callable[[], str | None]) -> Evidence | None:
    """Evidence from the step's metadata file: `read_text` returns None when it is absent.

    `read_text` may raise OSError, which the caller treats as transient (it is not evidence).
    """
    text = read_text()
    if text is None:
        return Evidence.MISSING_STEP_METADATA
    try:
        data = json.loads(text)
    except ValueError:
        return Evidence.INVALID_STEP_METADATA
    return None if isinstance(data, dict) else Evidence.INVALID_STEP_METADATA


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of transient read errors with exponential backoff."""

    attempts: int = 4
    first_delay: float = 0.5
    factor: float = 2.0
    max_delay: float = 8.0

    def delays(self) -> Iterator[float]:
        """The sleep before each retry (attempts - 1 of them)."""
        delay = self.first_delay
        for _ in range(max(0, self.attempts - 1)):
            yield min(delay, self.max_delay)
            delay *= self.factor


def first_line(error: BaseException, limit: int = 300) -> str:
    """`Type: first line` of an error, bounded for logs and termination messages."""
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"[:limit]


@dataclass(frozen=True)
class ReadFailed:
    """A read that did not succeed, and what its last error says about the checkpoint."""

    failure: ReadFailure
    detail: str


def read_with_retries(
    read: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    errors: tuple[type[BaseException], ...] = (Exception,),
    sleep: Callable[[float], None] = time.sleep,
) -> T | ReadFailed:
    """`read()`'s value, retrying transient `errors` with the policy's backoff; otherwise why
    it failed: corrupt at the first such error, transient once the retries are spent."""
    delays = policy.delays()
    while True:
        try:
            return read()
        except errors as error:
            failure, detail = classify_read_error(error), first_line(error)
            delay = next(delays, None) if failure is ReadFailure.TRANSIENT else None
            if delay is None:
                return ReadFailed(failure, detail)
            log.warning("%s: transient read error (%s); retrying in %.1fs", what, detail, delay)
            sleep(delay)
