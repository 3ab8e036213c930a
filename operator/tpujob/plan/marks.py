"""The node marks a job's failed nodes call for: made once, and taken off when the node is back.

Pure: part of `planner.plan`. A mark is a journaled effect (decided in the status, carried
out after the status write, and due again until a reconcile sees it made).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime, timedelta

from tpujob.api import BadNodeAction, FailedNode, labels
from tpujob.api.reasons import EventReason, EventType
from tpujob.diagnosis.model import FailureCode
from tpujob.observed.nodes import down_now, tpu_short, under_maintenance
from tpujob.observed.views import NodeView, Observed
from tpujob.plan.failed_nodes import mark_reason, marked_by, repaired, return_due
from tpujob.plan.result import Draft, EventSpec, NodeMark, PlannerSettings

__all__ = ["mark_blamed_nodes", "orphaned_marks"]


def mark_blamed_nodes(obs: Observed, draft: Draft, settings: PlannerSettings) -> None:
    """The node mark as a journaled effect: due until the node is seen marked, then never again.

    The decision that blames a node is written to the status before the mark is made; a crash
    in between leaves `marked` unset, and the next reconcile marks the node. Once a reconcile
    sees the mark it records so, and an administrator who later clears the mark of a repaired
    node is not overruled. A node blamed for being lost that has come back and stayed healthy
    (`failed_nodes.return_due`) has the mark this job made taken off, so that every job and
    pool gets it back; a reconcile is asked for when that is due.
    """
    job, now = obs.job, draft.now
    after = settings.node_health.lost_node_return_seconds
    action = job.spec.recovery.bad_node_action
    planned = {m.node for m in draft.mark_nodes}
    updated, changed = [], False
    for failed in draft.status.failed_nodes:
        node = obs.nodes.get(failed.name)
        reason = mark_reason(job.namespace, job.name, failed.code)
        if node is not None:
            _take_off_if_back(draft, failed, node, action, reason=reason, after=after)
        # A node recreated before its mark was seen is a new VM: the mark was for the old one.
        if (
            failed.marked
            or failed.job_only
            or node is None
            or action is BadNodeAction.NONE
            or repaired(failed, node, action, now=now, return_after=after)
        ):
            updated.append(failed)
            continue
        if _marked(node, action):
            updated.append(failed.model_copy(update={"marked": True}))
            changed = True
            continue
        updated.append(failed)
        if failed.name not in planned:
            draft.mark_nodes.append(NodeMark(failed.name, action, reason))
    if changed:
        draft.update(failed_nodes=tuple(updated))


def _take_off_if_back(
    draft: Draft,
    failed: FailedNode,
    node: NodeView,
    action: BadNodeAction,
    *,
    reason: str,
    after: float,
) -> None:
    """A lost node that came back: wait until it has held for `after`, then take off the mark
    this job made on it (`failed_nodes.return_due`)."""
    due = return_due(failed, node, now=draft.now, return_after=after)
    if due is None:
        return
    if due > 0:
        draft.requeue(due)
        return
    if not _ours(failed, node, action, reason):
        return
    draft.mark_nodes.append(NodeMark(failed.name, action, reason, clear=True))
    # Told at the moment it became due, so every reconcile until the mark is seen gone names
    # the same Event, and it is told once.
    draft.events.append(
        EventSpec(
            EventType.NORMAL,
            EventReason.NODE_TRUSTED_AGAIN,
            f"node {failed.name}, lost, is back Ready for {after:.0f}s: its mark is taken off; "
            "it still counts against maxFailedNodes",
            (node.ready_since or draft.now) + timedelta(seconds=after),
        )
    )


def _ours(failed: FailedNode, node: NodeView, action: BadNodeAction, reason: str) -> bool:
    """Whether the mark on `node` is the one this job made for `failed`."""
    return bool(failed.marked) and _marked(node, action) and node.mark_reason == reason


def _marked(node: NodeView, action: BadNodeAction) -> bool:
    if action is BadNodeAction.CORDON:
        return node.unschedulable
    return action is BadNodeAction.TAINT and node.has_taint(labels.BAD_NODE_TAINT)


def orphaned_marks(
    nodes: Iterable[NodeView],
    live_jobs: Collection[tuple[str, str]],
    *,
    now: datetime,
    return_after: float,
) -> list[NodeMark]:
    """Marks for a lost node whose job is gone, on nodes back long enough: the operator takes
    them off in that job's stead.

    Only the job that marked a lost node takes its mark off (`_take_off_if_back`); a job
    deleted first (a TTL, a CI run) would leave the node marked for every job forever. A mark
    of a node lost, by a job that no longer exists, on a node Ready for `return_after` with all
    its TPUs and no maintenance, is cleared here, guarded as the job's own clear is (only while
    the node still carries that very mark). Marks for other failures stay: those nodes are
    broken until someone repairs them.
    """
    cleared = []
    for node in nodes:
        reason = node.mark_reason
        who = marked_by(reason)
        if reason is None or who is None or who in live_jobs:
            continue
        if not reason.endswith(f": {FailureCode.NODE_LOST}"):
            continue
        if down_now(node) or tpu_short(node) or under_maintenance(node):
            continue
        if node.ready_since is None or (now - node.ready_since).total_seconds() < return_after:
            continue
        for action in (BadNodeAction.TAINT, BadNodeAction.CORDON):
            if _marked(node, action):
                cleared.append(NodeMark(node.name, action, reason, clear=True))
                break
    return cleared
