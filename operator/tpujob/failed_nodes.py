"""A job's failed nodes: which of them it still avoids, and how a new blame is recorded.

Pure. A node a job blamed stays in `status.failedNodes` for good (it counts against
`maxFailedNodes` once, however often it fails), but the job stops avoiding it once the cluster
shows it repaired:
- the Node object is a new one (another uid under the same name): GKE's auto-repair
  recreates the VM, whose kubelet registers a new Node, so nothing of the broken one is left;
- or the mark this job made on it (the taint or cordon of `badNodeAction`) was seen and has
  since been taken off: an administrator or a repair declared it fixed, and the job follows
  what it told everyone else.
A job-only blame (the job's own failure recurred there; the node is never marked) ends only
with a new Node: nothing else about the node changed, and the program may fail there again.
A node repaired that way and blamed again is recorded afresh (new uid, marked again).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

from tpujob import labels
from tpujob.api import BadNodeAction, FailedNode
from tpujob.observed import NodeView, Observed

__all__ = ["avoided_by", "avoided_nodes", "record_blames", "repaired"]


def repaired(failed: FailedNode, node: NodeView | None, action: BadNodeAction) -> bool:
    """Whether the cluster shows `failed`'s node repaired since this job blamed it."""
    if node is None:
        return False  # gone: nothing to place on, and nothing that says it was fixed
    if failed.uid and node.uid and node.uid != failed.uid:
        return True
    if not failed.marked or failed.job_only:
        return False
    if action is BadNodeAction.CORDON:
        return not node.unschedulable
    if action is BadNodeAction.TAINT:
        return not node.has_taint(labels.BAD_NODE_TAINT)
    return False


def avoided_nodes(
    failed_nodes: Collection[FailedNode], nodes: Mapping[str, NodeView], action: BadNodeAction
) -> frozenset[str]:
    """The failed nodes the job's pods must not be placed on: those not repaired since."""
    return frozenset(f.name for f in failed_nodes if not repaired(f, nodes.get(f.name), action))


def avoided_by(obs: Observed) -> frozenset[str]:
    """The observed job's failed nodes that it still avoids."""
    job = obs.job
    return avoided_nodes(job.status.failed_nodes, obs.nodes, job.spec.recovery.bad_node_action)


def record_blames(
    failed_nodes: Collection[FailedNode],
    *,
    blame: Collection[str],
    mark: Collection[str],
    nodes: Mapping[str, NodeView],
    action: BadNodeAction,
    code: str,
    now: datetime,
) -> list[FailedNode]:
    """`failed_nodes` with this failure's blames: new nodes added, repaired ones renewed.

    A node this job alone blamed before that is now to be marked (lost, its TPUs unhealthy,
    the ledger) is marked from then on like any other.
    """
    out: list[FailedNode] = []
    for f in failed_nodes:
        node = nodes.get(f.name)
        if f.name in blame and repaired(f, node, action):
            out.append(_blamed(f.name, node, mark=f.name in mark, code=code, now=now))
        elif f.job_only and f.name in mark:
            out.append(f.model_copy(update={"job_only": None}))
        else:
            out.append(f)
    known = {f.name for f in out}
    out += [
        _blamed(n, nodes.get(n), mark=n in mark, code=code, now=now)
        for n in blame
        if n not in known
    ]
    return out


def _blamed(
    name: str, node: NodeView | None, *, mark: bool, code: str, now: datetime
) -> FailedNode:
    return FailedNode(
        name=name,
        time=now,
        code=code,
        uid=(node.uid or None) if node else None,
        job_only=None if mark else True,
    )
