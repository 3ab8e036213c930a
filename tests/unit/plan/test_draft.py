"""A plan edits the status only through typed, named fields."""

from __future__ import annotations

from tpujob.api import TPUTrainingJobStatus
from tpujob.plan.result import StatusEdit


def test_every_typed_edit_names_a_status_field_and_conditions_and_timeline_are_not_among_them() -> (
    None
):
    editable = set(StatusEdit.__annotations__)
    assert editable <= set(TPUTrainingJobStatus.model_fields)
    assert {"conditions", "timeline"}.isdisjoint(editable)
    # Every other field of the status is editable: a new field is added here or said why not.
    assert set(TPUTrainingJobStatus.model_fields) - editable == {"conditions", "timeline"}
