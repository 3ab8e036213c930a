"""The vocabulary of a diagnosis: failure classes, failure codes and the `Diagnosis` value.

This is the bottom of the diagnosis subpackage: plain enums and frozen dataclasses, no logic
beyond formatting. The operator reads a `Diagnosis` to decide what to do (the class), to
report it (summary, chain, evidence, tag) and to guard against repeats (signature).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tpujob.api.enums import FailureClass

# One enum of classes for the API and the diagnosis; re-exported here for the engine.
__all__ = ["FailureClass"]


class FailureCode(enum.StrEnum):
    """Stable failure codes; the trainer contract's codes are a subset."""

    # Codes the trainer contract also uses (tpujob.api.contract.EXIT_CODES).
    UNKNOWN = "UNKNOWN"
    CONFIG_ERROR = "CONFIG_ERROR"
    DEVICE_FALLBACK_TO_CPU = "DEVICE_FALLBACK_TO_CPU"
    LIBTPU_VERSION_MISMATCH = "LIBTPU_VERSION_MISMATCH"
    DEVICE_BUSY = "DEVICE_BUSY"
    DEVICE_COUNT_MISMATCH = "DEVICE_COUNT_MISMATCH"
    USER_CODE_ERROR = "USER_CODE_ERROR"
    SHAPE_MISMATCH = "SHAPE_MISMATCH"
    HOST_OOM = "HOST_OOM"
    HBM_OOM = "HBM_OOM"
    COLLECTIVE_FAILURE = "COLLECTIVE_FAILURE"
    COLLECTIVE_TIMEOUT = "COLLECTIVE_TIMEOUT"
    CHECKPOINT_RESTORE_FAILED = "CHECKPOINT_RESTORE_FAILED"
    CHECKPOINT_SAVE_FAILED = "CHECKPOINT_SAVE_FAILED"
    PREEMPTED = "PREEMPTED"
    DATA_ERROR = "DATA_ERROR"
    FENCED = "FENCED"
    # Codes only the operator derives.
    HBM_OOM_AT_COMPILE = "HBM_OOM_AT_COMPILE"
    XLA_UNSUPPORTED_OP = "XLA_UNSUPPORTED_OP"
    XLA_PROGRAM_HALT = "XLA_PROGRAM_HALT"
    BACKEND_UNAVAILABLE = "BACKEND_UNAVAILABLE"
    VERSION_MISMATCH = "VERSION_MISMATCH"
    TOPOLOGY_MISMATCH = "TOPOLOGY_MISMATCH"
    LAUNCH_MISCONFIGURED = "LAUNCH_MISCONFIGURED"
    INVALID_SPEC = "INVALID_SPEC"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    COMMAND_NOT_FOUND = "COMMAND_NOT_FOUND"
    NAN_LOSS = "NAN_LOSS"
    RATE_LIMITED = "RATE_LIMITED"
    CAPACITY_UNAVAILABLE = "CAPACITY_UNAVAILABLE"
    STORAGE_UNAVAILABLE = "STORAGE_UNAVAILABLE"
    RUNTIME_SESSION_LOST = "RUNTIME_SESSION_LOST"
    PROCESS_KILLED = "PROCESS_KILLED"
    PROCESS_CRASHED = "PROCESS_CRASHED"
    NODE_LOST = "NODE_LOST"
    TPU_UNHEALTHY = "TPU_UNHEALTHY"
    ACCELERATOR_HARDWARE_ERROR = "ACCELERATOR_HARDWARE_ERROR"
    HOST_HARDWARE_ERROR = "HOST_HARDWARE_ERROR"
    INTERCONNECT_FAULT = "INTERCONNECT_FAULT"
    MAINTENANCE = "MAINTENANCE"
    EVICTED = "EVICTED"
    UNSCHEDULABLE = "UNSCHEDULABLE"
    ADMISSION_REJECTED = "ADMISSION_REJECTED"
    IMAGE_PULL_FAILED = "IMAGE_PULL_FAILED"
    CRASH_LOOP = "CRASH_LOOP"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    HANG = "HANG"
    DETERMINISTIC_REPEAT = "DETERMINISTIC_REPEAT"
    UNKNOWN_RETRY_LIMIT = "UNKNOWN_RETRY_LIMIT"


class Confidence(enum.StrEnum):
    """How sure the engine is: high for explicit facts, low for guesses from weak text."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


class Source(enum.StrEnum):
    """Where a piece of evidence came from."""

    USER_RULE = "user-rule"
    SITE_RULE = "site-rule"
    NODE = "node"
    POD = "pod"
    SCHEDULER = "scheduler"
    HEARTBEAT = "heartbeat"
    TRAINER = "trainer"
    MESSAGE = "message"
    LOG = "log"
    CONTEXT = "context"
    EXIT = "exit"
    HISTORY = "history"
    MODEL = "model"
    DEFAULT = "default"


@dataclass(frozen=True)
class Evidence:
    """One fact or line that a rule matched."""

    source: Source
    detail: str

    def __str__(self) -> str:
        return f"{self.source}: {self.detail}"


@dataclass(frozen=True)
class ChainLink:
    """One step of the error chain, from root cause to symptom."""

    description: str
    worker: int | None = None
    code: FailureCode | None = None

    def __str__(self) -> str:
        who = f"worker {self.worker}: " if self.worker is not None else ""
        return f"{who}{self.description}"


DEFAULT_ACTIONS: dict[FailureClass, str] = {
    FailureClass.SOFT: "restart the workers in place from the last checkpoint",
    FailureClass.MEDIUM: "restart from the last checkpoint after a backoff, with adjusted timeouts",
    FailureClass.HARD: "isolate the node or slice and reschedule the workers elsewhere",
    FailureClass.FATAL: "fail the job now; retrying cannot fix it",
}


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on one failure, with the reasoning a person needs to trust it."""

    failure_class: FailureClass
    code: FailureCode
    summary: str
    confidence: Confidence
    rule: str
    chain: tuple[ChainLink, ...] = ()
    evidence: tuple[Evidence, ...] = ()
    action: str = ""
    advice: str = ""
    signature: str = ""
    root_worker: int | None = None
    step: int | None = None  # training step at the failure, for the repeat guard
    consequence: bool = False  # the error only says a peer went away
    probability: float | None = None  # the text model's probability, when it decided

    @property
    def tag(self) -> str:
        return tag(self.failure_class)

    @property
    def headline(self) -> str:
        """The one line for logs and Event messages."""
        return f"{self.tag} {self.code}: {self.summary}"

    def as_dict(self) -> dict[str, object]:
        return {
            "class": str(self.failure_class),
            "code": str(self.code),
            "summary": self.summary,
            "confidence": str(self.confidence),
            "rule": self.rule,
            "chain": [str(link) for link in self.chain],
            "evidence": [str(item) for item in self.evidence],
            "action": self.action,
            "advice": self.advice,
            "signature": self.signature,
            "root_worker": self.root_worker,
            "step": self.step,
            "probability": self.probability,
        }


def tag(failure_class: FailureClass) -> str:
    """The prefix of log lines and Event messages: `[SOFT]`, `[MEDIUM]`, `[HARD]`, `[FATAL]`."""
    return f"[{failure_class.value.upper()}]"
