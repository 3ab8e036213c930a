"""A job's failed nodes: which of them it still avoids, and how a new blame is recorded.

Pure. A node a job blamed stays in `status.failedNodes` for good (it counts against
`maxFailedNodes` once, however often it fails), but the job stops avoiding it once the cluster
shows it repaired:
- the Node object is a new one (another uid under the same name): GKE's auto-repair
  recreates the VM, whose kubelet registers a new Node, so nothing of the broken one is left;
- or the mark this job made on it (the taint or cordon of `badNodeAction`) was seen and has
  since been taken off: an administrator or a repair declared it fixed, and the job follows
  what it told everyone else.
- or it was blamed only for being lost (NotReady, unreachable) and has come back, the same
  Node object, Ready with all its TPUs and stayed so for a while (`return_after`, the
  operator's `--lost-node-return`): a kubelet whose Lease renewals ran late, or a network
  partition, loses a node for a while without anything being broken. The job then also
  takes off the mark it made, so that other jobs and pools get the node back. This is
  trusted once per Node object: a node lost again after it came back (`relapsed`) stays
  avoided until it is recreated or its mark cleared.
A job-only blame (the job's own failure recurred there; the node is never marked) ends only
with a new Node: nothing else about the node changed, and the program may fail there again.
A node repaired that way and blamed again is recorded afresh (new uid, marked again).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime

from tpujob.api import BadNodeAction, FailedNode, labels
from tpujob.diagnosis.model import FailureCode
from tpujob.observed.nodes import down_now, tpu_short, under_maintenance
from tpujob.observed.views import NodeView, Observed

__all__ = [
    "avoided_by",
    "avoided_nodes",
    "mark_reason",
    "marked_by",
    "record_blames",
    "repaired",
    "return_due",
]


def mark_reason(namespace: str, name: str, code: str | None) -> str:
    """What the job writes on a node it marks: who marked it and why. A job takes off only a
    mark whose reason is its own for a lost node."""
    return f"{namespace}/{name}: {code or 'hard failure'}"[:256]


def marked_by(reason: str | None) -> tuple[str, str] | None:
    """The (namespace, name) of the job a `mark_reason` names, if it names one."""
    who = (reason or "").partition(": ")[0]
    namespace, _, name = who.partition("/")
    return (namespace, name) if namespace and name and "/" not in name else None


def return_due(
    failed: FailedNode, node: NodeView | None, *, now: datetime, return_after: float
) -> float | None:
    """Seconds until a node blamed only for being lost has been back long enough to be
    trusted again: 0 or less once it has, None when it is not back (or may not return)."""
    if (
        node is None
        or failed.code != FailureCode.NODE_LOST
        or failed.relapsed
        or failed.time is None
        or (failed.uid and node.uid != failed.uid)
        or down_now(node)
        or tpu_short(node)
        or under_maintenance(node)
        or node.ready_since is None
        or node.ready_since <= failed.time  # never seen to go and come back since the blame
    ):
        return None
    return return_after - (now - node.ready_since).total_seconds()


def repaired(
    failed: FailedNode,
    node: NodeView | None,
    action: BadNodeAction,
    *,
    now: datetime,
    return_after: float,
) -> bool:
    """Whether the cluster shows `failed`'s node repaired since this job blamed it."""
    if node is None:
        return False  # gone: nothing to place on, and nothing that says it was fixed
    if failed.uid and node.uid and node.uid != failed.uid:
        return True
    due = return_due(failed, node, now=now, return_after=return_after)
    if due is not None and due <= 0:
        return True
    if not failed.marked or failed.job_only:
        return False
    if action is BadNodeAction.CORDON:
        return not node.unschedulable
    if action is BadNodeAction.TAINT:
        return not node.has_taint(labels.BAD_NODE_TAINT)
    return False


def avoided_nodes(
    failed_nodes: Collection[FailedNode],
    nodes: Mapping[str, NodeView],
    action: BadNodeAction,
    *,
    now: datetime,
    return_after: float,
) -> frozenset[str]:
    """The failed nodes the job's pods must not be placed on: those not repaired since."""
    return frozenset(
        f.name
        for f in failed_nodes
        if not repaired(f, nodes.get(f.name), action, now=now, return_after=return_after)
    )


def avoided_by(obs: Observed, *, now: datetime, return_after: float) -> frozenset[str]:
    """The observed job's failed nodes that it still avoids."""
    job = obs.job
    return avoided_nodes(
        job.status.failed_nodes,
        obs.nodes,
        job.spec.recovery.bad_node_action,
        now=now,
        return_after=return_after,
    )


def record_blames(
    failed_nodes: Collection[FailedNode],
    *,
    blame: Collection[str],
    mark: Collection[str],
    nodes: Mapping[str, NodeView],
    action: BadNodeAction,
    code: str,
    now: datetime,
    return_after: float,
) -> list[FailedNode]:
    """`failed_nodes` with this failure's blames: new nodes added, repaired ones renewed.

    A node this job alone blamed before that is now to be marked (lost, its TPUs unhealthy,
    the ledger) is marked from then on like any other. A repaired node blamed again while
    still the same Node object has relapsed: coming back Ready no longer clears it.
    """
    out: list[FailedNode] = []
    for f in failed_nodes:
        node = nodes.get(f.name)
        if f.name in blame and repaired(f, node, action, now=now, return_after=return_after):
            renewed = _blamed(f.name, node, mark=f.name in mark, code=code, now=now)
            same = bool(node and f.uid and node.uid == f.uid)
            out.append(renewed.model_copy(update={"relapsed": True}) if same else renewed)
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
