"""spec.recovery: how failures are retried, within which budgets, and the user's own rules.

Part of the API layer (pydantic only). Budgets count restarts per failure class; the operator
keeps the counts on the job's status so that recreating children never resets them.
"""

from __future__ import annotations

import re
from typing import Annotated

import re2
from pydantic import ConfigDict, Field, field_validator, model_validator

from tpujob.api import constants as c
from tpujob.api.base import SpecModel, cel, validations
from tpujob.api.enums import BadNodeAction, FailureClass

DEFAULT_MAX_SOFT_RESTARTS = 20
DEFAULT_MAX_MEDIUM_RESTARTS = 5
DEFAULT_MAX_HARD_RESTARTS = 3
DEFAULT_MAX_NAN_ROLLBACKS = 3
DEFAULT_MAX_FAILED_NODES = "20%"
DEFAULT_BACKOFF_INITIAL_SECONDS = 10
DEFAULT_BACKOFF_MAX_SECONDS = 300
DEFAULT_STALL_TIMEOUT_SECONDS = 600
# Joining the job, restoring a large checkpoint from cloud storage and compiling the first
# step take minutes on real slices; a start-up hang is the rarer failure, so the limit is long.
DEFAULT_STARTUP_TIMEOUT_SECONDS = 1800
# Below this a busy host's stall timeout fires on a healthy step; 0 is "off".
MIN_STALL_TIMEOUT_SECONDS = 10

# 0% to 50%, one spelling per value; the same expression runs in CEL and in Python.
PERCENT_PATTERN = "^(50|[1-4]?[0-9])%$"
_PERCENT = re.compile(PERCENT_PATTERN)

Seconds = Annotated[int, Field(ge=0, le=c.MAX_SECONDS)]


class InvalidPatternError(ValueError):
    """A user rule's messagePattern does not compile."""


class Backoff(SpecModel):
    """Delay before a restart: doubles from initialSeconds up to maxSeconds per restart."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.initialSeconds) || !has(self.maxSeconds)"
                " || self.initialSeconds <= self.maxSeconds",
                "initialSeconds must be less than or equal to maxSeconds",
                field_path=".initialSeconds",
            )
        )
    )

    initial_seconds: Seconds = Field(
        default=DEFAULT_BACKOFF_INITIAL_SECONDS, description="Delay before the first restart."
    )
    max_seconds: Seconds = Field(
        default=DEFAULT_BACKOFF_MAX_SECONDS, description="Upper bound of the delay."
    )

    @model_validator(mode="after")
    def _ordered(self) -> Backoff:
        if self.initial_seconds > self.max_seconds:
            raise ValueError("initialSeconds must be less than or equal to maxSeconds")
        return self

    def delay(self, restarts: int) -> int:
        """Seconds to wait before restart number `restarts` + 1 (0 for the first)."""
        return min(self.max_seconds, self.initial_seconds << min(restarts, 32))


class UserRule(SpecModel):
    """Maps failures to a class before the built-in rules are consulted.

    A rule matches when every matcher it sets matches: the exit code is one of exitCodes, the
    termination or disruption reason is one of reasons, and messagePattern is found in the
    termination message or log tail. The first matching rule wins.
    """

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "has(self.exitCodes) || has(self.reasons) || has(self.messagePattern)",
                "a rule needs at least one of exitCodes, reasons or messagePattern",
            )
        )
    )

    exit_codes: tuple[Annotated[int, Field(ge=0, le=255)], ...] | None = Field(
        default=None,
        min_length=1,
        max_length=c.MAX_RULE_MATCHERS,
        description="Container exit codes (0-255) this rule matches.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    reasons: tuple[Annotated[str, Field(min_length=1, max_length=128)], ...] | None = Field(
        default=None,
        min_length=1,
        max_length=c.MAX_RULE_MATCHERS,
        description=(
            "Container termination reasons (e.g. OOMKilled, Error), pod disruption reasons "
            "(e.g. PreemptionByScheduler) or trainer failure codes (e.g. HBM_OOM) it matches."
        ),
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    message_pattern: str | None = Field(
        default=None,
        min_length=1,
        max_length=c.MAX_PATTERN_LENGTH,
        description=(
            "A regular expression in RE2 syntax searched for in the termination message "
            "and log tail; it must compile."
        ),
        json_schema_extra=validations(
            # CEL has no regex-validity test; matches() with the pattern as its regex fails
            # evaluation when the pattern does not compile, and the apiserver reports that
            # failure with this message at this field.
            cel(
                "type(''.matches(self)) == bool",
                "messagePattern must be a valid RE2 regular expression",
            )
        ),
    )
    failure_class: FailureClass = Field(
        alias="class", description="The class given to matching failures."
    )
    code: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^[A-Z][A-Z0-9_]*$",
        description="Failure code reported in status (UPPER_SNAKE_CASE); USER_RULE by default.",
    )

    @field_validator("message_pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        # The engine runs user patterns with RE2 (linear time, no backtracking); admission
        # refuses here exactly what the engine could not run, as the CEL rule does in the
        # apiserver (CEL's matches() is RE2 too).
        if pattern is not None:
            options = re2.Options()
            options.log_errors = False
            try:
                re2.compile(pattern, options)
            except re2.error as exc:
                reason = exc.args[0] if exc.args else exc
                if isinstance(reason, bytes):
                    reason = reason.decode("utf-8", "replace")
                raise InvalidPatternError(
                    "recovery.rules[].messagePattern does not compile as an RE2 regular expression"
                    f" (lookaround and backreferences are not supported): {reason}"
                ) from exc
        return pattern

    @model_validator(mode="after")
    def _has_matcher(self) -> UserRule:
        if self.exit_codes is None and self.reasons is None and self.message_pattern is None:
            raise ValueError("a rule needs at least one of exitCodes, reasons or messagePattern")
        return self


def _budget(default: int, what: str) -> int:
    return Field(
        default=default,
        ge=0,
        le=c.MAX_RESTARTS,
        description=(
            f"Restarts allowed for {what} failures before the job fails (default {default})."
        ),
    )


class RecoverySpec(SpecModel):
    """How the operator keeps the job training through failures."""

    auto_recovery: bool = Field(
        default=True,
        description="Restart after failures. False: diagnose the first failure, then fail the job.",
    )
    max_soft_restarts: int = _budget(DEFAULT_MAX_SOFT_RESTARTS, "soft (preemption, peer lost)")
    max_medium_restarts: int = _budget(
        DEFAULT_MAX_MEDIUM_RESTARTS, "medium (timeouts, host OOM, checkpoint I/O)"
    )
    max_hard_restarts: int = _budget(DEFAULT_MAX_HARD_RESTARTS, "hard (bad device or node)")
    max_nan_rollbacks: int = Field(
        default=DEFAULT_MAX_NAN_ROLLBACKS,
        ge=0,
        le=20,
        description=(
            "Rollbacks after a non-finite (NaN/inf) loss: each restarts from the last "
            "checkpoint before the anomaly and skips the data window that led to it. One more "
            "non-finite loss fails the job with advice."
        ),
    )
    max_failed_nodes: int | str = Field(
        default=DEFAULT_MAX_FAILED_NODES,
        description=(
            "Distinct nodes that may be blamed for hard failures before the job fails: an "
            "integer, or a percentage of the job's hosts rounded up (at most 50%)."
        ),
        json_schema_extra={
            "x-kubernetes-int-or-string": True,
            **validations(
                cel(
                    f"type(self) == int ? self >= 0 : self.matches({PERCENT_PATTERN!r})",
                    "maxFailedNodes must be a non-negative integer or a percentage "
                    "from 0% to 50% of the job's hosts",
                )
            ),
        },
    )
    backoff: Backoff = Field(
        default_factory=Backoff,
        description="Exponential delay between restarts.",
        json_schema_extra={"default": {}},
    )
    stall_timeout_seconds: int = Field(
        default=DEFAULT_STALL_TIMEOUT_SECONDS,
        ge=0,
        le=c.MAX_SECONDS,
        description=(
            "Once the trainer has announced the heartbeat contract, a job whose step has not "
            "advanced for this long (heartbeat stale) is treated as hung and restarted as a "
            "soft failure. 0 turns stall detection off; a trainer that never announces the "
            "contract runs without it. Pod and node signals apply either way."
        ),
        json_schema_extra=validations(
            cel(
                f"self == 0 || self >= {MIN_STALL_TIMEOUT_SECONDS}",
                f"stallTimeoutSeconds must be 0 (off) or at least {MIN_STALL_TIMEOUT_SECONDS}",
            )
        ),
    )
    startup_timeout_seconds: int = Field(
        default=DEFAULT_STARTUP_TIMEOUT_SECONDS,
        ge=MIN_STALL_TIMEOUT_SECONDS,
        le=c.MAX_SECONDS,
        description=(
            "From its workers running to its first step, an attempt whose trainer announced "
            "the heartbeat contract may take this long (joining the job, restoring, compiling) "
            "before it counts as hung. Off when stallTimeoutSeconds is 0."
        ),
    )
    bad_node_action: BadNodeAction = Field(
        default=BadNodeAction.TAINT, description="What to do to a node blamed for a hard failure."
    )
    rules: tuple[UserRule, ...] = Field(
        default=(),
        max_length=c.MAX_RULES,
        description="User rules, checked in order before the built-in classification.",
    )

    @field_validator("stall_timeout_seconds")
    @classmethod
    def _stall_off_or_long_enough(cls, value: int) -> int:
        if 0 < value < MIN_STALL_TIMEOUT_SECONDS:
            raise ValueError(
                f"stallTimeoutSeconds must be 0 (off) or at least {MIN_STALL_TIMEOUT_SECONDS}"
            )
        return value

    @field_validator("max_failed_nodes")
    @classmethod
    def _in_range(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 0:
                raise ValueError("maxFailedNodes must not be negative")
            return value
        if _PERCENT.match(value) is None:
            raise ValueError(
                "maxFailedNodes must be a non-negative integer or a percentage from 0% to 50%"
            )
        return value

    def max_failed_nodes_count(self, total_hosts: int) -> int:
        """The failed-node budget as a node count for a job of `total_hosts` hosts.

        Percentages round up, so a small job tolerates one bad node under the default 20%.
        The status records at most `MAX_FAILED_NODES_RECORDED` failed nodes (the oldest go
        first), so a larger budget could never be seen spent: it counts as one less than that.
        """
        if isinstance(self.max_failed_nodes, int):
            count = self.max_failed_nodes
        else:
            percent = int(self.max_failed_nodes.rstrip("%"))
            count = -(-total_hosts * percent // 100)
        return min(count, c.MAX_FAILED_NODES_RECORDED - 1)

    def budget(self, failure_class: FailureClass) -> int:
        """Restarts allowed for a class; 0 for fatal, which is never retried."""
        return {
            FailureClass.SOFT: self.max_soft_restarts,
            FailureClass.MEDIUM: self.max_medium_restarts,
            FailureClass.HARD: self.max_hard_restarts,
        }.get(failure_class, 0)
