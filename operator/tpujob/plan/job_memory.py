"""The job's memory applied to a fresh diagnosis, before the recovery policy decides.

Two rules, both pure:
* A guess never stops a job or blames a node. When no rule named the failure and only the
  text model graded it, with low confidence, fatal or hard, the operator restarts once as it
  would an unknown failure (medium) and lets a repeat decide: retrying a deterministic failure
  once costs one start-up, failing a transient one kills a healthy run. The rule is the
  diagnosis's (`tpujob.diagnosis.unknown.weigh_model_guess`), so that `tpujob diagnose` says
  what the operator does.
* Where a failure recurs decides its grade (`tpujob.diagnosis.memory.judge`): the same
  signature again on the same node after a restart is the node (hard, that node blamed); on
  other nodes or slices it is the program (fatal, with the evidence); a soft failure that
  in-place restarts do not clear gets a backoff, then stops.
Every escalation is written into the diagnosis itself (summary, evidence), so the status, the
Event and `tpujob describe` all say so. The status's failure records become the diagnosis's
`PastFailure` here (`past_failure`), for the repeat guards and the memory alike.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from tpujob import diagnosis as dx
from tpujob.api.attempt import FailureRecord
from tpujob.diagnosis.cascade import OWN_BUDGET_CODES
from tpujob.diagnosis.escalation import escalate
from tpujob.diagnosis.history import PastFailure
from tpujob.diagnosis.memory import Escalation, failure_signature, judge

_Enum = TypeVar("_Enum", bound=enum.StrEnum)

# Failures with a recovery policy of their own (a non-finite loss rolls back past its data,
# with its own budget): the memory records them but does not regrade them.
OWN_POLICY = OWN_BUDGET_CODES

ESCALATION_ADVICE = {
    Escalation.ACROSS_NODES: "the same failure recurs wherever the job runs, so it is the "
    "program or its configuration: fix the cause in the evidence",
    Escalation.GIVE_UP: "the failure did not clear after restarts and backoffs; read the "
    "worker logs",
}


@dataclass(frozen=True)
class Recalled:
    """A diagnosis after the memory, and the node the memory blames (if any)."""

    diagnosis: dx.Diagnosis
    blamed_node: str | None
    record: FailureRecord


def past_failure(record: FailureRecord) -> PastFailure:
    """The status record as the diagnosis reads it; every record, however old, is kept.

    The repeat guards need only the signature, code, step and node, which every record has;
    the memory's fields are None where the record predates them or holds a code or class
    this operator does not know, and the memory skips such records.
    """
    return PastFailure(
        signature=record.signature,
        code=_known(dx.FailureCode, record.code),
        step=record.step,
        node=record.node or "",
        slice_index=record.slice,
        attempt=record.attempt,
        failure_class=_known(dx.FailureClass, record.failure_class),
        memory_signature=record.memory_signature,
        progressed=bool(record.progressed),
    )


def _known(kind: type[_Enum], value: str | None) -> _Enum | None:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:  # written by another version of the operator
        return None


def recall(
    d: dx.Diagnosis,
    history: Sequence[PastFailure],
    *,
    attempt: int,
    node: str | None,
    slice_index: int | None,
    progressed: bool,
) -> Recalled:
    """Grade `d` by the job's history; `history` excludes the current failure."""
    memory_signature = failure_signature(d.code, d.summary)
    current = PastFailure(
        signature=d.signature,
        code=d.code,
        step=d.step,
        node=node or "",
        slice_index=slice_index,
        attempt=attempt,
        failure_class=d.failure_class,
        memory_signature=memory_signature,
        progressed=progressed,
    )
    verdict = judge([*history, current])
    blamed = None
    if verdict.escalation is not Escalation.NONE and d.code not in OWN_POLICY:
        d = escalate(
            d,
            to=verdict.failure_class,
            note=f" ({verdict.evidence})",
            evidence=dx.Evidence(dx.Source.HISTORY, verdict.evidence),
            advice=ESCALATION_ADVICE.get(verdict.escalation, d.advice),
        )
        blamed = verdict.blamed_node
    record = FailureRecord.model_validate(
        {
            "signature": d.signature[:256],
            "code": str(d.code),
            "step": d.step,
            "node": node,
            "attempt": attempt,
            "slice": slice_index,
            "class": str(d.failure_class),
            "memorySignature": memory_signature,
            "progressed": progressed,
        }
    )
    return Recalled(d, blamed, record)
