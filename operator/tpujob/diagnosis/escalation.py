"""Regrading a diagnosis: the one way every later judgement changes the grade it was given.

Pure. A regrade never hides what it changed: the new class (if any), a note on the summary
and the evidence that moved it are all written into the diagnosis, so the status, the Event
and `tpujob describe` say why the grade is not the one the log alone gave.
"""

from __future__ import annotations

from dataclasses import replace

from tpujob.diagnosis.model import Diagnosis, Evidence, FailureClass


def escalate(
    d: Diagnosis,
    *,
    note: str,
    evidence: Evidence,
    to: FailureClass | None = None,
    advice: str | None = None,
    action: str | None = None,
    signature: str | None = None,
) -> Diagnosis:
    """`d` regraded: `to` its new class (None keeps it), `note` appended to its summary as it
    is written, `evidence` added; `advice`, `action` and `signature` replace the old ones when
    given."""
    return replace(
        d,
        failure_class=d.failure_class if to is None else to,
        summary=d.summary + note,
        evidence=(*d.evidence, evidence),
        advice=d.advice if advice is None else advice,
        action=d.action if action is None else action,
        signature=d.signature if signature is None else signature,
    )
