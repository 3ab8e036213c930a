"""The recovery engine's memory: what a job's past failures, and other jobs', say about this one.

A failure that comes back is evidence no single failure carries. Where it comes back says
what is broken: the same signature again on the same node after a restart blames the node
(hard); the same signature on different nodes or slices is the program (it follows the
code: fatal, with the evidence "seen 3 times on 3 nodes"), unless it was graded hard (a
broken node or slice each time, which the job moves off and the budgets bound); a soft
failure that a few in-place restarts did not clear needs a backoff (medium), then it stops.
An attempt that reported progress of its own between two failures (past the step the first
one struck) cuts the run there: it trained, so the repeat is not deterministic; training
before the first failure proves nothing either way. Across jobs, a node that two different
jobs blamed softly within a window is broken even if neither job alone said so (the node
ledger).

Pure: the operator passes the history and the time in, keeps the ledger in a ConfigMap it
owns (`ledger_to_data` / `ledger_from_data`), and reports each escalation's `evidence` in
the status, the Event and `tpujob describe`.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpujob.diagnosis.history import PastFailure
from tpujob.diagnosis.linear import compile_linear
from tpujob.diagnosis.model import FailureClass, FailureCode

DEFAULT_SOFT_RESTARTS = 3  # in-place restarts a soft failure gets before a backoff
DEFAULT_MEDIUM_RESTARTS = 2  # backoff restarts after that, before giving up
DEFAULT_LEDGER_WINDOW_S = 24 * 3600.0
DEFAULT_LEDGER_ENTRIES = 256  # ~25 KB as JSON: far under a ConfigMap's 1 MiB
LEDGER_KEY = "ledger.json"

# Failures caused from outside: they are expected to recur and prove nothing by recurring.
# A SIGKILL or SIGTERM from outside (PROCESS_KILLED) names no cause of its own: whoever sent
# it did so twice, which says nothing of the node or the program; the soft ladder bounds it.
EXTERNAL_CODES = frozenset(
    {
        FailureCode.PROCESS_KILLED,
        FailureCode.PREEMPTED,
        FailureCode.MAINTENANCE,
        FailureCode.EVICTED,
        FailureCode.UNSCHEDULABLE,
        FailureCode.CAPACITY_UNAVAILABLE,
        FailureCode.RATE_LIMITED,
        FailureCode.ADMISSION_REJECTED,
    }
)
# The note `diagnose_job` adds when other workers failed after the root says how fast the
# operator looked, not what failed: it is no part of the signature.
_VOLATILE = compile_linear(
    r"\(\d+ other workers? failed after\)"
    r"|0x[0-9a-f]+|\b[0-9a-f]{8,}\b|\d+(?:\.\d+)*|(?:[\w.-]*/[\w.@+=-]+){2,}|\s+",
    where="built-in signature normaliser",
)


def failure_signature(code: FailureCode | str, root_message: str) -> str:
    """`CODE:digest` of the code and the root message with numbers, ids and paths removed."""
    normalised = _VOLATILE.sub(" ", root_message.lower()).strip()
    digest = hashlib.sha256(f"{code}|{normalised}".encode()).hexdigest()[:12]
    return f"{code}:{digest}"


class Escalation(enum.StrEnum):
    """Why the memory changed a failure's grade."""

    NONE = "none"
    SAME_NODE = "recurs-on-same-node"
    ACROSS_NODES = "recurs-across-nodes"
    SOFT_NOT_CLEARING = "soft-not-clearing"
    GIVE_UP = "did-not-clear"


@dataclass(frozen=True)
class MemoryVerdict:
    escalation: Escalation
    failure_class: FailureClass
    blamed_node: str | None = None
    evidence: str = ""


def _remembered(failure: PastFailure) -> bool:
    """Whether the record carries what the memory judges by."""
    return (
        failure.memory_signature is not None
        and failure.attempt is not None
        and failure.failure_class is not None
        and failure.code is not None
    )


def _repeats(history: Sequence[PastFailure]) -> list[PastFailure]:
    """The trailing run of the current failure's memory signature, cut where one progressed.

    `progressed` is the attempt that ended in that failure, so it says whether the job
    trained between the failure before and this one: a run reaches back past a failure only
    while the failure after it did not progress. The first attempt nearly always trained
    before its failure; that says nothing about whether the second one repeats it.
    """
    current = history[-1]
    run = [current]
    for prior in reversed(history[:-1]):
        if run[-1].progressed or prior.memory_signature != current.memory_signature:
            break
        run.append(prior)
    return run[::-1]


def judge(
    history: Sequence[PastFailure],
    *,
    soft_restarts: int = DEFAULT_SOFT_RESTARTS,
    medium_restarts: int = DEFAULT_MEDIUM_RESTARTS,
) -> MemoryVerdict:
    """The escalation the job's history calls for; `history[-1]` is the current failure.

    Earlier records without the memory's fields (written before it existed) are skipped."""
    if not history:
        raise ValueError("the history holds at least the current failure")
    current = history[-1]
    cls = current.failure_class
    if cls is None or not _remembered(current):
        raise ValueError("the current failure carries the memory's fields")
    if not cls.retrying or current.progressed:
        return MemoryVerdict(Escalation.NONE, cls)
    run = _repeats([*(f for f in history[:-1] if _remembered(f)), current])
    places = {(f.node, f.slice_index) for f in run}
    nodes = {f.node for f in run}
    if len(run) >= 2 and current.code not in EXTERNAL_CODES:
        if len(places) == 1 and current.node:
            return MemoryVerdict(
                Escalation.SAME_NODE,
                FailureClass.HARD,
                blamed_node=current.node,
                evidence=f"seen {len(run)} times in a row on node {current.node}",
            )
        if cls is FailureClass.HARD:
            # A broken node or slice each time, and the job moved off it: recurring elsewhere
            # is another one (the failed-node and hard-restart budgets bound them), not the
            # program.
            return MemoryVerdict(Escalation.NONE, cls)
        return MemoryVerdict(
            Escalation.ACROSS_NODES,
            FailureClass.FATAL,
            evidence=f"seen {len(run)} times on {len(nodes)} nodes"
            f" ({len({f.slice_index for f in run})} slices) without progress",
        )
    soft_run = [f for f in run if f.failure_class is FailureClass.SOFT]
    if cls is FailureClass.SOFT and len(soft_run) > soft_restarts:
        if len(soft_run) > soft_restarts + medium_restarts:
            return MemoryVerdict(
                Escalation.GIVE_UP,
                FailureClass.FATAL,
                evidence=f"soft failure did not clear after {len(soft_run) - 1} restarts",
            )
        return MemoryVerdict(
            Escalation.SOFT_NOT_CLEARING,
            FailureClass.MEDIUM,
            evidence=f"soft failure did not clear after {len(soft_run) - 1} in-place restarts",
        )
    return MemoryVerdict(Escalation.NONE, cls)


@dataclass(frozen=True)
class Blame:
    """A job's soft blame of a node at a time (seconds since the epoch)."""

    node: str
    job: str
    at: float


@dataclass(frozen=True)
class NodeLedger:
    """Soft blames of nodes across jobs, newest last, bounded in count and age."""

    blames: tuple[Blame, ...] = ()


def record_blame(
    ledger: NodeLedger,
    blame: Blame,
    *,
    now: float,
    window_s: float = DEFAULT_LEDGER_WINDOW_S,
    max_entries: int = DEFAULT_LEDGER_ENTRIES,
) -> tuple[NodeLedger, MemoryVerdict]:
    """Add a soft blame; hard (node blamed) when two different jobs blamed it in the window."""
    kept = [b for b in ledger.blames if now - b.at <= window_s and b != blame]
    kept.append(blame)
    updated = NodeLedger(tuple(kept[-max_entries:]))
    jobs = sorted({b.job for b in updated.blames if b.node == blame.node})
    if len(jobs) >= 2:
        return updated, MemoryVerdict(
            Escalation.SAME_NODE,
            FailureClass.HARD,
            blamed_node=blame.node,
            evidence=f"node {blame.node} failed {len(jobs)} different jobs"
            f" within {window_s / 3600:.0f}h: {', '.join(jobs[:5])}",
        )
    return updated, MemoryVerdict(Escalation.NONE, FailureClass.SOFT)


class LedgerFormatError(ValueError):
    """The stored ledger cannot be read (the operator starts a new one)."""


def ledger_to_data(ledger: NodeLedger) -> dict[str, str]:
    """The ledger as a ConfigMap's `data`."""
    rows = [[b.node, b.job, round(b.at, 3)] for b in ledger.blames]
    return {LEDGER_KEY: json.dumps(rows, separators=(",", ":"))}


def ledger_from_data(
    data: Mapping[str, str], *, max_entries: int = DEFAULT_LEDGER_ENTRIES
) -> NodeLedger:
    """Read a ConfigMap's `data` back (untrusted: malformed is a typed error)."""
    raw = data.get(LEDGER_KEY)
    if raw is None:
        return NodeLedger()
    try:
        rows = json.loads(raw)
        blames = tuple(Blame(str(n), str(j), float(t)) for n, j, t in rows[-max_entries:])
    except (ValueError, TypeError) as error:
        raise LedgerFormatError(f"{LEDGER_KEY}: {error}") from error
    return NodeLedger(blames)
