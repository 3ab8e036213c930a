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


def test_a_claim_lets_go_only_of_the_jobs_own_pools_and_never_takes_anothers() -> None:
    claims = PoolClaims()
    claims.claim(("team", "a"), status())
    # b's status names a's pool too (a stale placement): a keeps it, b holds only its own.
    both = {"currentAttempt": {"placement": [{"slice": 0, "nodePool": "pool-0"}]}}
    both["currentAttempt"]["placement"].append({"slice": 1, "nodePool": "pool-2"})
    claims.claim(("team", "b"), status(**both))
    assert claims.holders == {"pool-0": ("team", "a"), "pool-2": ("team", "b")}
    assert claims.claim(("team", "b"), None) == ["pool-2"]
    assert claims.holders == {"pool-0": ("team", "a")}
    assert claims.claim(("team", "a"), None) == ["pool-0"]
    assert claims.holders == {} and claims.held == {}
