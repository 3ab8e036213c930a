"""The fencing token on the heartbeat Lease: written with the job's uid, never moved back."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpujob.api import contract
from tpujob.kube.apply import ApiWriter

FENCE, JOB = contract.LEASE_FENCE_ANNOTATION, contract.LEASE_FENCE_JOB_ANNOTATION
OURS, THEIRS = "uid-new", "uid-old"


class FakeLeases:
    """The three CoordinationV1Api calls `fence` makes, over one stored Lease (or none)."""

    def __init__(self, owner: str | None, annotations: dict[str, str]) -> None:
        self.owner, self.annotations = owner, annotations
        self.created: dict[str, Any] | None = None
        self.patches: list[dict[str, Any]] = []
        self.calls: list[str] = []

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        self.calls.append("read")
        if self.owner is None:
            raise ApiException(status=404, reason="NotFound")
        return SimpleNamespace(
            metadata=SimpleNamespace(
                annotations=dict(self.annotations),
                resource_version="7",
                owner_references=[SimpleNamespace(uid=self.owner)],
            )
        )

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.calls.append("create")
        if self.owner is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self.created = body

    def patch_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> None:
        self.calls.append("patch")
        self.patches.append(body["metadata"])


def lease() -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "train-heartbeat",
            "namespace": "team",
            "ownerReferences": [{"uid": OURS, "kind": "TPUTrainingJob"}],
        },
    }


def fenced(leases: FakeLeases, attempt: int) -> FakeLeases:
    writer = ApiWriter(client.ApiClient())
    writer.coordination = leases  # type: ignore[assignment]
    writer.fence(lease(), attempt)
    return leases


@pytest.mark.parametrize(
    ("attempt", "calls"),
    [(1, ["create"]), (2, ["read", "create"])],
    ids=["first-attempt-creates-at-once", "later-attempt-reads-first"],
)
def test_a_new_lease_carries_the_token_and_the_jobs_uid(attempt: int, calls: list[str]) -> None:
    leases = fenced(FakeLeases(None, {}), attempt)
    assert leases.created is not None
    assert leases.created["metadata"]["annotations"] == {FENCE: str(attempt), JOB: OURS}
    assert leases.calls == calls


@pytest.mark.parametrize(
    ("annotations", "attempt", "patch"),
    [
        ({FENCE: "2", JOB: OURS}, 3, {FENCE: "3", JOB: OURS}),
        ({FENCE: "5", JOB: OURS}, 3, None),
        ({FENCE: "3", JOB: OURS}, 3, None),
        # Written before the uid went with the token: named, and the newer token stays.
        ({FENCE: "5"}, 3, {JOB: OURS}),
    ],
    ids=["advances", "never-back", "already-there", "names-the-job-keeps-the-token"],
)
def test_the_token_of_this_jobs_lease_only_moves_forward(
    annotations: dict[str, str], attempt: int, patch: dict[str, str] | None
) -> None:
    leases = fenced(FakeLeases(OURS, annotations), attempt)
    assert [p["annotations"] for p in leases.patches] == ([patch] if patch else [])
    assert all(p["resourceVersion"] == "7" for p in leases.patches)


def test_an_earlier_jobs_lease_is_taken_over_token_owner_and_uid() -> None:
    leases = fenced(FakeLeases(THEIRS, {FENCE: "7", JOB: THEIRS, "tpujob.dev/step": "90"}), 1)
    [patch] = leases.patches
    assert patch["annotations"] == {FENCE: "1", JOB: OURS, "tpujob.dev/step": None}
    assert [r["uid"] for r in patch["ownerReferences"]] == [OURS]
