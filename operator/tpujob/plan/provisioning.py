"""Slices with no free pool: wait for one, or (spec.tpu.provisioning Autoscale) launch anyway
and learn the pool the autoscaler provides from where the pods land.

Pure, part of planning. With ExistingPools a slice starts only on a free pool; the job waits,
and says so once by an Event and in its Running condition. With Autoscale the slice's pods are
created pinned to no pool but kept whole in one pool no other slice uses
(`manifests.gang`): GKE's cluster autoscaler and node auto-provisioning act on pending pods
and never on a job that only waits, so the pending pods are the demand they scale for. Once a
pod of the slice is bound, the node's pool is recorded as the slice's: later pods of the slice
(a re-created one, the next attempt's) are pinned to it like any chosen pool.
"""

from __future__ import annotations

from collections.abc import Mapping

from tpujob.api import ConditionType, Provisioning
from tpujob.api.reasons import ConditionReason, EventReason, EventType, TimelineKind
from tpujob.gcp.catalogue import pool_advice
from tpujob.observed.views import Observed
from tpujob.plan.placement import placement, pools_of
from tpujob.plan.result import Draft


def autoscaled(obs: Observed) -> bool:
    return obs.job.spec.tpu.provisioning is Provisioning.AUTOSCALE


def unplaced(obs: Observed, pools: Mapping[int, str], slices: int | None = None) -> list[int]:
    """The slices without a pool, of the job's or of the attempt's `slices`."""
    count = obs.job.spec.tpu.slices if slices is None else slices
    return [s for s in range(count) if s not in pools]


def say_no_free_pool(obs: Observed, draft: Draft, pools: Mapping[int, str]) -> bool:
    """Tell that some slices have no free pool; True when the attempt launches anyway."""
    tpu = obs.job.spec.tpu
    missing = unplaced(obs, pools)
    shape = f"{tpu.accelerator} {tpu.topology}"
    if autoscaled(obs):
        reason = ConditionReason.PROVISIONING
        message = (
            f"{len(missing)} of {tpu.slices} slices have no free {shape} pool: their pods "
            "wait for the cluster autoscaler to provide one (spec.tpu.provisioning: Autoscale)"
        )
    else:
        reason = ConditionReason.WAITING_FOR_POOL
        advice = pool_advice(obs.catalogue, tpu.accelerator, tpu.topology)
        message = f"{len(missing)} of {tpu.slices} slices have no free {shape} pool" + (
            f"; {advice}" if advice else ""
        )
    before = obs.job.status.condition(ConditionType.RUNNING)
    draft.condition(ConditionType.RUNNING, False, reason, message)
    if before is None or before.reason != reason:
        draft.event(EventType.NORMAL, EventReason.WAITING_FOR_POOL, message)
    return autoscaled(obs)


def learn_pools(obs: Observed, draft: Draft) -> None:
    """Record the pool each unplaced slice's bound pods landed in (the first one seen)."""
    current = draft.status.current_attempt
    known = pools_of(current)
    if not autoscaled(obs) or len(known) >= obs.job.spec.tpu.slices:
        return
    found: dict[int, str] = {}
    for pod in obs.attempt_pods(obs.job.status.attempt):
        node = obs.nodes.get(pod.node) if pod.node else None
        if pod.slice not in known and node is not None and node.pool:
            found.setdefault(pod.slice, node.pool)
    if not found:
        return
    draft.update(
        current_attempt=current.model_copy(update={"placement": placement({**known, **found})})
    )
    landed = ", ".join(f"slice {s} on {p}" for s, p in sorted(found.items()))
    draft.timeline(TimelineKind.PLACEMENT, f"provisioned: {landed}")
    draft.event(EventType.NORMAL, EventReason.PLACEMENT, f"provisioned: {landed}")
