"""The node ledger applied to a fresh diagnosis: soft blames of one node across jobs.

A node that makes the workers of two different tenants fail softly within a window is broken
even though neither job, alone, had reason to blame it (`tpujob.diagnosis.memory.record_blame`).
The ledger is shared by every job the operator runs, so who may write into it matters: a blame
counts only when it comes from the operator's own reading of a pod the job owns on that node,
never from a user's rule, and only blames from *other namespaces* can turn it hard, so no
single tenant can get a node tainted by failing on purpose. A hard verdict is the same as the
job history's "recurs on the same node": the node is tainted and the slice moves.

Pure: the operator passes the ledger's rows in (`Observed.node_blames`) and persists the blame
this failure adds (`Plan.ledger_blame`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from tpujob import diagnosis as dx
from tpujob.diagnosis.escalation import escalate
from tpujob.diagnosis.memory import EXTERNAL_CODES, Blame, NodeLedger, record_blame

LEDGER_ADVICE = "the node was tainted; the slice runs elsewhere"
# The soft failures whose mechanism lives on the host, so that two tenants meeting one on the
# same node says something about the node: its TPU devices or runtime, its interconnect, a
# process crashing by a signal of the hardware. A storage 503, a lost peer, a fenced attempt,
# a hang read from a log or a guess of the text model says nothing about where it ran, and
# would otherwise get a healthy node tainted by two tenants' bad afternoon.
NODE_EVIDENCE_CODES = frozenset(
    {
        dx.FailureCode.DEVICE_BUSY,
        dx.FailureCode.BACKEND_UNAVAILABLE,
        dx.FailureCode.RUNTIME_SESSION_LOST,
        dx.FailureCode.PROCESS_CRASHED,
        dx.FailureCode.ACCELERATOR_HARDWARE_ERROR,
        dx.FailureCode.INTERCONNECT_FAULT,
    }
)


@dataclass(frozen=True)
class LedgerOutcome:
    diagnosis: dx.Diagnosis
    blame: Blame | None = None  # to add to the ledger
    blamed_node: str | None = None  # hard: taint it and move the slice


def ledger_job(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _tenant(job: str) -> str:
    return job.split("/", 1)[0]


def weigh_ledger(
    d: dx.Diagnosis,
    *,
    node: str | None,
    namespace: str,
    name: str,
    blames: Sequence[tuple[str, str, float]],
    now: datetime,
) -> LedgerOutcome:
    """Add this failure's soft blame of `node`; hard when another tenant blamed it lately."""
    trusted = not any(e.source is dx.Source.USER_RULE for e in d.evidence)
    if (
        d.failure_class is not dx.FailureClass.SOFT
        or not node
        or not trusted
        or d.code in EXTERNAL_CODES  # caused from outside, or killed by someone: not the host
        or d.code not in NODE_EVIDENCE_CODES
        or d.probability is not None  # the text model's guess, not a mechanism seen
    ):
        return LedgerOutcome(d)
    blame = Blame(node=node, job=ledger_job(namespace, name), at=now.timestamp())
    others = NodeLedger(tuple(Blame(n, j, at) for n, j, at in blames if _tenant(j) != namespace))
    _, verdict = record_blame(others, blame, now=blame.at)
    if verdict.failure_class is not dx.FailureClass.HARD or verdict.blamed_node is None:
        return LedgerOutcome(d, blame)
    evidence = verdict.evidence.replace("different jobs", "jobs of different namespaces")
    hard = escalate(
        d,
        to=dx.FailureClass.HARD,
        note=f" ({evidence})",
        advice=LEDGER_ADVICE,
        evidence=dx.Evidence(dx.Source.HISTORY, evidence),
    )
    return LedgerOutcome(hard, blame, verdict.blamed_node)
