"""The placement authority's claims: the pools a job's slices run on and its warm spares."""

from __future__ import annotations

from tpujob.api.status import TPUTrainingJobStatus
from tpujob.controller.deps import PoolClaims


def status(**fields: object) -> TPUTrainingJobStatus:
    return TPUTrainingJobStatus.model_validate(
        {
            "phase": "Running",
            "currentAttempt": {"placement": [{"slice": 0, "nodePool": "pool-0"}]},
            **fields,
        }
    )


def test_a_warm_spare_is_claimed_as_a_placed_pool_is_and_released_when_let_go() -> None:
    claims = PoolClaims()
    holding = status(spares=[{"nodePool": "pool-1", "ready": True}])
    assert claims.claim(("team", "a"), holding) == []
    assert claims.claimed_by_others(("team", "b")) == {"pool-0", "pool-1"}
    assert claims.claimed_by_others(("team", "a")) == frozenset()
    assert claims.claim(("team", "a"), status()) == ["pool-1"]
    assert claims.claim(("team", "a"), status(phase="Succeeded", spares=[{"nodePool": "x"}])) == [
        "pool-0"
    ]
