"""After the diagnosis, before the recovery policy: what the operator knows beyond the log.

Pure. The diagnosis grades a failure from what it shows; then each row of `REGRADING`, in
order, may regrade it from what the operator has seen around it:

1. leak: a host OOM kill that `HostMemoryGrowing` predicted is a leak (`health_conditions`);
2. model guess: a weak guess of the text model never stops a job or blames a node
   (`tpujob.diagnosis.unknown.weigh_model_guess`);
3. repeat guard: when a row above changed the class, the job's earlier failures get their say
   on the new one, as the diagnosis gave them on the first;
4. history: where the failure recurs in this job decides its grade, and may blame a node
   (`job_memory.recall`), which also makes this failure's record;
5. ledger: soft blames of one node by jobs of other namespaces make it hard
   (`node_ledger.weigh_ledger`), and this failure's soft blame is added.

Each row reads a `Regrading` and returns the next one; every change is written into the
diagnosis itself (`tpujob.diagnosis.escalation.escalate`), so the status says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum

from tpujob import diagnosis as dx
from tpujob.api.attempt import FailureRecord
from tpujob.diagnosis.memory import Blame
from tpujob.diagnosis.unknown import weigh_model_guess
from tpujob.observed.views import Observed
from tpujob.plan.health_conditions import grade_leak
from tpujob.plan.job_memory import recall
from tpujob.plan.node_ledger import weigh_ledger


@dataclass(frozen=True)
class Around:
    """What the rows read besides the diagnosis: the job, where the failure struck, when."""

    obs: Observed
    history: Sequence[dx.PastFailure]  # the job's earlier failures, oldest first
    diagnosed_class: dx.FailureClass  # the class the diagnosis gave, before any row
    root_node: str | None
    root_slice: int | None
    progressed: bool
    unknown_retry_limit: int
    now: datetime


@dataclass(frozen=True)
class Regrading:
    """A diagnosis on its way through the table, with what the rows found."""

    diagnosis: dx.Diagnosis
    record: FailureRecord | None = None  # this failure as the job's memory keeps it
    memory_blame: str | None = None  # the node the job's own history blames
    ledger_blame: Blame | None = None  # this failure's soft blame, for the node ledger
    ledger_node: str | None = None  # the node jobs of other namespaces blamed with it


class Row(StrEnum):
    LEAK = "leak"
    MODEL_GUESS = "model-guess"
    REPEAT_GUARD = "repeat-guard"
    HISTORY = "history"
    LEDGER = "ledger"


def _leak(r: Regrading, around: Around) -> Regrading:
    return replace(r, diagnosis=grade_leak(r.diagnosis, around.obs))


def _model_guess(r: Regrading, around: Around) -> Regrading:
    return replace(r, diagnosis=weigh_model_guess(r.diagnosis))


def _repeat_guard(r: Regrading, around: Around) -> Regrading:
    if r.diagnosis.failure_class is around.diagnosed_class:
        return r  # the diagnosis already applied it to this class
    guarded = dx.apply_history(
        r.diagnosis,
        around.history,
        node_name=around.root_node or "",
        unknown_retry_limit=around.unknown_retry_limit,
    )
    return replace(r, diagnosis=guarded)


def _history(r: Regrading, around: Around) -> Regrading:
    status = around.obs.job.status
    recalled = recall(
        r.diagnosis,
        around.history,
        attempt=status.attempt,
        node=around.root_node,
        slice_index=around.root_slice,
        progressed=around.progressed,
    )
    return replace(
        r, diagnosis=recalled.diagnosis, record=recalled.record, memory_blame=recalled.blamed_node
    )


def _ledger(r: Regrading, around: Around) -> Regrading:
    job = around.obs.job
    shared = weigh_ledger(
        r.diagnosis,
        node=around.root_node,
        namespace=job.namespace,
        name=job.name,
        blames=around.obs.node_blames,
        now=around.now,
    )
    return replace(
        r, diagnosis=shared.diagnosis, ledger_blame=shared.blame, ledger_node=shared.blamed_node
    )


# Ordered: each row sees the grade the rows above left.
REGRADING: tuple[tuple[Row, Callable[[Regrading, Around], Regrading]], ...] = (
    (Row.LEAK, _leak),
    (Row.MODEL_GUESS, _model_guess),
    (Row.REPEAT_GUARD, _repeat_guard),
    (Row.HISTORY, _history),
    (Row.LEDGER, _ledger),
)


def regrade(d: dx.Diagnosis, around: Around) -> Regrading:
    """`d` through every row of `REGRADING`, in order."""
    r = Regrading(d)
    for _, row in REGRADING:
        r = row(r, around)
    return r
