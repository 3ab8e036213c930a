"""The job's memory applied to a fresh diagnosis, before the recovery policy decides.

Two rules, both pure:
* A guess never stops a job or blames a node. When no rule named the failure and only the
  text model graded it, with low confidence, fatal or hard, the operator restarts once as it
  would an unknown failure (medium) and lets a repeat decide: retrying a deterministic failure
  once costs one start-up, failing a transient one kills a healthy run.
* Where a failure recurs decides its grade (`tpujob.diagnosis.memory.judge`): the same
  signature again on the same node after a restart is the node (hard, that node blamed); on
  other nodes or slices it is the program (fatal, with the evidence); a soft failure that
  in-place restarts do not clear gets a backoff, then stops.
Every escalation is written into the diagnosis itself (summary, evidence), so the status, the
Event and `tpujob describe` all say so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tpujob import diagnosis as dx
from tpujob.api.attempt import FailureRecord
from tpujob.diagnosis.cascade import OWN_BUDGET_CODES
from tpujob.diagnosis.memory import Escalation, PastFailure, failure_signature, judge
from tpujob.diagnosis.model import DEFAULT_ACTIONS
from tpujob.plan.escalation import escalate

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


def weigh_model_guess(d: dx.Diagnosis) -> dx.Diagnosis:
    """A low-confidence model verdict of fatal or hard becomes the unknown default (medium)."""
    if (
        d.probability is None
        or d.confidence is not dx.Confidence.LOW
        or d.failure_class not in (dx.FailureClass.FATAL, dx.FailureClass.HARD)
    ):
        return d
    return escalate(
        d,
        to=dx.FailureClass.MEDIUM,
        note="; too weak a guess to act on: restarted once, a repeat decides",
        action=DEFAULT_ACTIONS[dx.FailureClass.MEDIUM],
        evidence=dx.Evidence(dx.Source.MODEL, f"model probability {d.probability:.2f}"),
    )


def _past(record: FailureRecord) -> PastFailure | None:
    if record.memory_signature is None or record.attempt is None or record.failure_class is None:
        return None  # written before the memory existed
    try:
        code = dx.FailureCode(record.code)
        cls = dx.FailureClass(record.failure_class)
    except ValueError:
        return None
    return PastFailure(
        attempt=record.attempt,
        node=record.node or "",
        slice_index=record.slice,
        signature=record.memory_signature,
        code=code,
        failure_class=cls,
        progressed=bool(record.progressed),
    )


def recall(
    d: dx.Diagnosis,
    history: Sequence[FailureRecord],
    *,
    attempt: int,
    node: str | None,
    slice_index: int | None,
    progressed: bool,
) -> Recalled:
    """Grade `d` by the job's history; `history` excludes the current failure."""
    signature = failure_signature(d.code, d.summary)
    current = PastFailure(
        attempt=attempt,
        node=node or "",
        slice_index=slice_index,
        signature=signature,
        code=d.code,
        failure_class=d.failure_class,
        progressed=progressed,
    )
    past = [p for p in (_past(r) for r in history) if p is not None]
    verdict = judge([*past, current])
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
            "memorySignature": signature,
            "progressed": progressed,
        }
    )
    return Recalled(d, blamed, record)
