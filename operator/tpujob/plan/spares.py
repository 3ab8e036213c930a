"""Warm spares: whole pools a job holds for its hard failures (`spec.tpu.spares`). Pure.

A spare is held by idle pods, one per host of the pool, each asking for the slice's chips and
running the trainer's image doing nothing. Other jobs see the pool busy and leave it (a TPU
pool is one slice); its nodes stay up, since an autoscaler removes no node whose chips a pod
asks for; and its nodes have pulled the trainer's image. A hard failure that moves a slice
places it on a spare first (`placement.PoolRank.SPARE`): the spare's idle pods are deleted in
the same reconcile that creates the slice's pods there, so the move waits for no pool to free.

Decisions, written down:
- Spares are taken only while an attempt runs (launched, phase Running): a launch never waits
  for a spare and never loses a pool to one; the reserve is refilled from free pools as they
  free, never from pools busy with other jobs or with host maintenance due within the run.
- A spare whose pool turns unusable (a node lost, blamed or cordoned), whose idle pod ended,
  or that exceeds `spec.tpu.spares` (the field was lowered) is let go; a job that ends or is
  suspended lets every spare go.
- The idle pod's command is `sleep infinity`: the trainer's image must have `sleep` (every
  image with a shell does); one that ends is let go and its pool taken again on a later
  reconcile, not in the same one, so an image without it costs a pod a poll, not a loop.
- An idle pod is the job's only when its name is the one this module gives for its pool and
  host; any other pod labelled as a spare of the job is deleted.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from tpujob.api import Phase, TPUTrainingJob, labels
from tpujob.api.reasons import TimelineKind
from tpujob.api.status import SparePool
from tpujob.observed.views import Observed, PodView
from tpujob.plan import manifests, pod_security
from tpujob.plan.placement import PoolRank, expected_end, plan_placement, pools_for, pools_of
from tpujob.plan.pod_template import add_template, selects
from tpujob.plan.result import Draft, PodDeletion

SPARE_COMMAND = ("sleep", "infinity")
# An idle pod has nothing to save: it goes at once.
SPARE_GRACE_SECONDS = 0


def spare_pod_name(job: str, pool: str, worker: int) -> str:
    """A name per (pool, host): pool names are free text to a pod name, so a digest."""
    digest = hashlib.sha256(pool.encode()).hexdigest()[:10]
    return f"{job}-spare-{digest}-{worker}"


def spare_pod(job: TPUTrainingJob, pool: str, worker: int) -> dict[str, Any]:
    """One idle pod holding host `worker` of `pool` for the job."""
    tpu, trainer = job.spec.tpu, job.spec.trainer
    container: dict[str, Any] = {
        "name": "spare",
        "image": trainer.image,
        "command": list(SPARE_COMMAND),
        "resources": {"limits": {labels.TPU_RESOURCE: str(tpu.chips_per_host)}}
        if tpu.chips_per_host
        else {},
        "securityContext": pod_security.container_security_context(trainer.security),
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": pod_security.pod_security_context(trainer.security),
        "terminationGracePeriodSeconds": SPARE_GRACE_SECONDS,
        "nodeSelector": {
            labels.ACCELERATOR: tpu.accelerator,
            labels.TOPOLOGY: tpu.topology,
            labels.NODEPOOL: pool,
        },
        "tolerations": [{"key": labels.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    meta = manifests.child_meta(job, spare_pod_name(job.name, pool, worker), {labels.SPARE: "true"})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    # The pod template's scheduling and pull settings (tolerations, priority, pull secrets),
    # not its volumes' mounts: an idle pod mounts nothing.
    return add_template(pod, trainer.pod_template, ())


def _worker_of(job: str, pod: PodView) -> int | None:
    """The host the idle pod holds, when its name is the one given for its pool."""
    if pod.node_pool is None:
        return None
    prefix = spare_pod_name(job, pod.node_pool, 0)[:-1]
    worker = pod.name.removeprefix(prefix)
    return int(worker) if pod.name.startswith(prefix) and worker.isdigit() else None


def held_spares(obs: Observed) -> dict[str, list[PodView]]:
    """The job's spare pools and their idle pods that still live."""
    held: dict[str, list[PodView]] = defaultdict(list)
    for pod in obs.spares:
        alive = not pod.terminal and pod.deleting_since is None
        if pod.node_pool and alive and _worker_of(obs.job.name, pod) is not None:
            held[pod.node_pool].append(pod)
    return dict(held)


def spare_pools(obs: Observed) -> frozenset[str]:
    """Pools a moved slice goes to first."""
    return frozenset(held_spares(obs))


def _let_go(pods: Iterable[PodView], draft: Draft) -> None:
    for pod in pods:
        if pod.deleting_since is None and not any(d.uid == pod.uid for d in draft.delete_pods):
            draft.delete_pods.append(PodDeletion(pod.name, pod.uid, SPARE_GRACE_SECONDS))


def release_spares(obs: Observed, draft: Draft) -> None:
    """Let every spare go (the job ended or is suspended)."""
    _let_go(obs.spares, draft)
    if draft.status.spares:
        draft.update(spares=())


def keep_spares(obs: Observed, draft: Draft, bad: frozenset[str]) -> None:
    """Hold `spec.tpu.spares` pools: let go of spares a slice now runs on or that went bad,
    take free pools while the attempt runs, and record them in the status."""
    job = obs.job
    tpu = job.spec.tpu
    if not tpu.spares and not obs.spares and not draft.status.spares:
        return
    placed = set(pools_of(draft.status.current_attempt).values())
    ended = [p for p in obs.spares if p.terminal or _worker_of(job.name, p) is None]
    _let_go(ended, draft)
    usable = {
        p.name
        for p in pools_for(obs.nodes.values(), tpu.accelerator, tpu.topology)
        if p.usable(tpu.hosts_per_slice, bad)
    }
    held = held_spares(obs)
    for pool in sorted(held):
        if pool in placed or pool not in usable or len(held) > tpu.spares:
            _let_go(held.pop(pool), draft)
    running = (
        draft.status.phase is Phase.RUNNING
        and draft.status.current_attempt.launched_time is not None
    )
    # A pool whose idle pod just ended is taken again once that pod is gone, not now.
    just_ended = {p.node_pool for p in ended if p.node_pool}
    if running and len(held) < tpu.spares:
        for pool in _free_pools(obs, draft, bad, tpu.spares - len(held), placed | set(held)):
            if pool not in just_ended:
                held[pool] = []
    for pool, pods in held.items():
        if pool in just_ended:
            continue
        have = {_worker_of(job.name, p) for p in pods}
        draft.create += [
            spare_pod(job, pool, w) for w in range(tpu.hosts_per_slice) if w not in have
        ]
    _record(draft, held, placed, tpu.hosts_per_slice)


def _record(draft: Draft, held: dict[str, list[PodView]], placed: set[str], hosts: int) -> None:
    spares = tuple(
        SparePool(node_pool=pool, ready=len(pods) == hosts and all(p.running for p in pods))
        for pool, pods in sorted(held.items())
    )
    if spares == draft.status.spares:
        return
    before = {s.node_pool for s in draft.status.spares}
    for pool in sorted(set(held) - before):
        draft.timeline(TimelineKind.SPARE_TAKEN, f"pool {pool} held as a warm spare")
    for pool in sorted((before - set(held)) & placed):
        draft.timeline(TimelineKind.SPARE_USED, f"warm spare {pool} now runs a slice")
    for pool in sorted(before - set(held) - placed):
        draft.timeline(TimelineKind.SPARE_RELEASED, f"warm spare {pool} let go")
    draft.update(spares=spares)


def _free_pools(
    obs: Observed, draft: Draft, bad: frozenset[str], want: int, avoid: set[str]
) -> list[str]:
    """Up to `want` free pools of the job's shape, not `avoid`, with no maintenance due."""
    job = obs.job
    tpu = job.spec.tpu
    nodes = [
        n
        for n in obs.nodes.values()
        if n.pool not in avoid
        and n.pool not in obs.busy_pools
        and selects(job.spec.trainer, n.labels)
    ]
    progress = job.status.progress
    result = plan_placement(
        slices=want,
        hosts_per_slice=tpu.hosts_per_slice,
        accelerator=tpu.accelerator,
        topology=tpu.topology,
        nodes=nodes,
        keep={},
        bad_nodes=bad,
        now=draft.now,
        run_until=expected_end(
            draft.now,
            step=progress.step if progress else None,
            total_steps=job.spec.trainer.total_steps,
            steps_per_second=progress.steps_per_second if progress else None,
        ),
    )
    due = {n.pool for n in result.notes if n.rank is PoolRank.MAINTENANCE_DUE}
    return sorted(p for p in result.pools.values() if p not in due)
