"""Choosing pools for an attempt's slices, with the caveats told: pure, part of planning."""

from __future__ import annotations

from collections.abc import Mapping

from tpujob.api.reasons import EventReason, EventType, TimelineKind
from tpujob.observed.views import Observed
from tpujob.plan.placement import expected_end, plan_placement
from tpujob.plan.pod_template import selects
from tpujob.plan.result import Draft


def _has_flavor_labels(obs: Observed, node_labels: Mapping[str, str]) -> bool:
    """Whether a node carries the node labels of the ResourceFlavors Kueue admitted the job
    with (`tpujob.plan.queueing`); always, for a job not admitted through Kueue."""
    wanted = obs.workload.node_labels if obs.workload is not None else {}
    return all(node_labels.get(k) == v for k, v in wanted.items())


def choose_pools(
    obs: Observed,
    keep: dict[int, str],
    bad: frozenset[str],
    *,
    draft: Draft,
    avoid: frozenset[str] = frozenset(),
    spares: frozenset[str] = frozenset(),
    tell: bool = True,
) -> dict[int, str]:
    """Pools for every slice (`keep` stays); a caveat, such as a pool taken although host
    maintenance is due there within the expected run, goes to the timeline and an Event.

    A pool busy with another job (its pods, or the operator's claim for a job whose pods do
    not exist yet) is not a candidate at all: a TPU pool is one slice, and two gangs sharing
    one would each hold part of it and both wait forever. A slice with no free pool is left
    out of the result; the attempt then waits instead of launching. `avoid` (a pool a moved
    slice leaves) is only placed last; `spares` (the job's warm spare pools) first. Only
    nodes the pod template's node selectors match count. `tell=False` only looks: a caveat
    is told when the pools are taken, not each time a job checks whether it could take them.
    """
    tpu, progress = obs.job.spec.tpu, obs.job.status.progress
    # A recorded pool another job took meanwhile (during a backoff, or two claims crossing
    # an operator restart) is given up and the slice placed again.
    keep = {s: p for s, p in keep.items() if p not in obs.busy_pools}
    kept = set(keep.values())
    trainer = obs.job.spec.trainer
    nodes = [
        n
        for n in obs.nodes.values()
        if (n.pool in kept or n.pool not in obs.busy_pools)
        and selects(trainer, n.labels)
        and _has_flavor_labels(obs, n.labels)
    ]
    result = plan_placement(
        slices=tpu.slices,
        hosts_per_slice=tpu.hosts_per_slice,
        accelerator=tpu.accelerator,
        topology=tpu.topology,
        nodes=nodes,
        keep=keep,
        bad_nodes=bad,
        busy_pools=avoid,
        spare_pools=spares,
        now=draft.now,
        run_until=expected_end(
            draft.now,
            step=progress.step if progress else None,
            total_steps=obs.job.spec.trainer.total_steps,
            steps_per_second=progress.steps_per_second if progress else None,
        ),
    )
    if tell and (note := result.describe()):
        draft.timeline(TimelineKind.PLACEMENT, note)
        draft.event(EventType.NORMAL, EventReason.PLACEMENT, note)
    return result.pools
