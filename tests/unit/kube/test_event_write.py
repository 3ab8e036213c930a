"""Events are named by their content, so a journaled Event told again is created once, and
the writer says which call told it (the controller logs only that one)."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpujob.kube.apply import ApiWriter
from tpujob.plan.result import EventSpec

JOB = {
    "apiVersion": "tpujob.dev/v1alpha1",
    "kind": "TPUTrainingJob",
    "metadata": {"name": "train", "namespace": "team", "uid": "u1"},
}


class FakeEvents:
    """`create_namespaced_event` over a store keyed by name, as the apiserver keeps them."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        name = body["metadata"]["name"]
        if name in self.stored:
            raise ApiException(status=409, reason="AlreadyExists")
        self.stored[name] = body


def test_an_event_told_again_is_created_once_and_only_the_first_call_says_it_told() -> None:
    writer = ApiWriter(client.ApiClient())
    events = FakeEvents()
    writer.core = events  # type: ignore[assignment]
    spec = EventSpec("Warning", "FailureDiagnosed", "[SOFT] worker killed")
    assert [writer.event(JOB, spec) for _ in range(3)] == [True, False, False]
    assert len(events.stored) == 1
    other = EventSpec("Normal", "Restarting", "attempt 2")
    assert writer.event(JOB, other) is True
    assert len(events.stored) == 2
