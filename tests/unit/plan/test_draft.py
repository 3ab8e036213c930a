"""A plan edits the status only through typed, named fields."""

from __future__ import annotations

from tests.unit.builders import at

from tpujob.api import TPUTrainingJobStatus
from tpujob.api.constants import TIMELINE_LIMIT
from tpujob.api.reasons import EventReason, EventType
from tpujob.plan.result import Draft, StatusEdit


def test_every_typed_edit_names_a_status_field_and_conditions_and_timeline_are_not_among_them() -> (
    None
):
    editable = set(StatusEdit.__annotations__)
    assert editable <= set(TPUTrainingJobStatus.model_fields)
    assert {"conditions", "timeline"}.isdisjoint(editable)
    # Every other field of the status is editable: a new field is added here or said why not.
    assert set(TPUTrainingJobStatus.model_fields) - editable == {"conditions", "timeline"}


def test_a_decision_with_more_events_than_the_journal_holds_still_writes_a_valid_status() -> None:
    # 52 nodes back from a partition at once: 52 NodeTrustedAgain Events in one plan.
    draft = Draft(status=TPUTrainingJobStatus(), now=at(0))
    for n in range(52):
        draft.event(EventType.NORMAL, EventReason.NODE_TRUSTED_AGAIN, f"node n{n} is back")
    draft.event(EventType.WARNING, EventReason.FAILURE_DIAGNOSED, "worker 0 failed")
    result = draft.done()
    assert len(result.events) == 53  # every Event is told
    journal = result.status.pending_events
    assert len(journal) == TIMELINE_LIMIT
    assert journal[-1].reason == EventReason.MORE_EVENTS
    assert journal[-1].type == EventType.WARNING
    assert journal[-1].message == (
        "4 more Events of this decision: FailureDiagnosed x1, NodeTrustedAgain x3"
    )
    # What the CRD enforces, pydantic enforces: the status written is one the apiserver takes.
    TPUTrainingJobStatus.model_validate(result.status.model_dump(by_alias=True))
