"""Turning a failure into the contract: a typed error, an exit code and a termination message.

`TrainerError` is raised by trainer code that already knows which contract code applies
(preflight, checkpoint restore, config). Anything else reaching the top is mapped by
`classify_exception`, an ordered rule table over the exception's type and text where the first
match wins; the text is matched because JAX reports most runtime failures as one
`JaxRuntimeError` whose message carries the XLA status (RESOURCE_EXHAUSTED, UNAVAILABLE, ...).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tpujob_trainer.contract import (
    ENV_TERMINATION_MESSAGE_PATH,
    EXIT_CODES,
    TERMINATION_MESSAGE_PATH,
    ExitCode,
    TerminationMessage,
    encode_termination_message,
)

TRACEBACK_TAIL_CHARS = 3000


class TrainerError(Exception):
    """A failure whose contract code the trainer already knows."""

    def __init__(self, exit_code: ExitCode, summary: str) -> None:
        super().__init__(summary)
        self.exit_code = exit_code
        self.summary = summary


@dataclass(frozen=True)
class Rule:
    """One row of the classification table: a predicate over the exception and its text."""

    matches: Callable[[BaseException, str], bool]
    exit_code: ExitCode


def _text_has(*needles: str) -> Callable[[BaseException, str], bool]:
    return lambda _exc, text: any(needle in text for needle in needles)


def _is_shape_error(exc: BaseException, text: str) -> bool:
    # JAX raises TypeError/ValueError from its shape rules while tracing; the word "shape" is in
    # all of them ("dot_general requires contracting dimensions to have the same shape", ...).
    return isinstance(exc, TypeError | ValueError) and "shape" in text


def _is_user_code(exc: BaseException, _text: str) -> bool:
    return isinstance(
        exc, TypeError | ValueError | KeyError | IndexError | AttributeError | ZeroDivisionError
    )


# Words that name the collectives' own transport (Gloo on CPU hosts) or JAX's coordination
# service, so an error that carries one was raised by a collective, whatever else it says. A
# bare "Connection reset by peer" or UNAVAILABLE may come from a storage client as well.
COLLECTIVE_WORDS = ("Gloo", "gloo", "heartbeat timeout")


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def raised_by_a_collective(exc: BaseException) -> bool:
    """Whether `exc` was raised by a collective (its transport or the coordination service)."""
    return _text_has(*COLLECTIVE_WORDS)(exc, _text(exc))


RULES: tuple[Rule, ...] = (
    Rule(lambda exc, _text: isinstance(exc, MemoryError), ExitCode.HOST_OOM),
    Rule(_text_has("RESOURCE_EXHAUSTED", "Out of memory"), ExitCode.HBM_OOM),
    Rule(_text_has("DEADLINE_EXCEEDED"), ExitCode.COORDINATION_TIMEOUT),
    Rule(
        _text_has(
            *COLLECTIVE_WORDS,
            "Connection closed by peer",
            "Connection reset by peer",
            "UNAVAILABLE",
        ),
        ExitCode.COLLECTIVE_FAILURE,
    ),
    Rule(_is_shape_error, ExitCode.SHAPE_MISMATCH),
    Rule(_is_user_code, ExitCode.USER_CODE_ERROR),
)


def classify_exception(exc: BaseException) -> ExitCode:
    """The contract code for an exception nobody handled; first matching rule wins."""
    if isinstance(exc, TrainerError):
        return exc.exit_code
    text = _text(exc)
    for rule in RULES:
        if rule.matches(exc, text):
            return rule.exit_code
    return ExitCode.UNKNOWN_ERROR


def describe(exc: BaseException) -> str:
    """A one-line summary: the contract's meaning plus the exception's own first line."""
    if isinstance(exc, TrainerError):
        return exc.summary
    first_line = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first_line}"[:600]


@dataclass(frozen=True)
class FailureContext:
    """What the trainer knew when it failed; every field is optional for early failures."""

    step: int | None = None
    checkpoint_step: int | None = None
    backend: str | None = None
    worker: int | None = None


def termination_message_path() -> Path:
    """Where the termination message goes: the env override, else the kubelet's default."""
    return Path(os.environ.get(ENV_TERMINATION_MESSAGE_PATH) or TERMINATION_MESSAGE_PATH)


def build_message(
    exit_code: ExitCode, summary: str, context: FailureContext, trace: str = ""
) -> TerminationMessage:
    """The termination message for `exit_code`, with the traceback's tail kept."""
    info = EXIT_CODES[exit_code]
    return TerminationMessage(
        code=info.code,
        exit_code=int(exit_code),
        class_hint=info.hint,
        summary=summary or info.summary,
        step=context.step,
        checkpoint_step=context.checkpoint_step,
        backend=context.backend,
        worker=context.worker,
        traceback=trace[-TRACEBACK_TAIL_CHARS:],
    )


def write_termination_message(message: TerminationMessage) -> None:
    """Write the message where the kubelet reads it; a failure to write must not mask the exit."""
    path = termination_message_path()
    try:
        path.write_text(encode_termination_message(message))
    except OSError as error:
        print(
            f"tpujob-trainer: cannot write termination message to {path}: {error}", file=sys.stderr
        )


def report_exception(exc: BaseException, context: FailureContext) -> ExitCode:
    """Describe `exc` on stderr and in the termination message; return its exit code."""
    exit_code = classify_exception(exc)
    trace = "".join(traceback.format_exception(exc))
    summary = describe(exc)
    # The traceback goes to stderr as well, because the operator's log-tail diagnosis reads it
    # when the termination message is missing (for example after a C++ abort in a peer).
    print(trace, file=sys.stderr, end="")
    print(
        f"tpujob-trainer: failed with {EXIT_CODES[exit_code].code} "
        f"(exit {int(exit_code)}): {summary}",
        file=sys.stderr,
        flush=True,
    )
    write_termination_message(build_message(exit_code, summary, context, trace))
    return exit_code
