"""What the status says about the attempt's pods that do not start: unschedulable, or on their
node with a container that has not started.

Pure; part of planning. Neither is a failure by itself: a pod the scheduler cannot place may
get a node once the autoscaler adds one, and a container waiting in `ContainerCreating` may be
waiting for its volume's claim to bind. But a job that waits with nothing said looks hung, so
after a grace the Running condition names one such pod and what it waits for. Waiting
states that already say the kubelet failed to start the container (an image it cannot pull, a
missing Secret) are failures and diagnosed (`tpujob.observed.trouble.FAILED_START_REASONS`).

Each message stays what it first said while the pod it names waits: a message that changed
with every pod event of the cluster (the scheduler's counts of nodes) or every second was a
status write each time. The pod named is the last of those waiting: the scheduler places a
gang's pods in the order they were made, so during a burst the first such pod was placed
moments later and the next one named, a status write per pod of the job.
"""

from __future__ import annotations

from datetime import datetime

from tpujob.api import ConditionType
from tpujob.api.reasons import ConditionReason
from tpujob.observed.views import PodView
from tpujob.plan.result import Draft

UNSCHEDULABLE_GRACE_SECONDS = 15.0
# A container that waits this long after its pod reached the node is named. Pulling a large
# image takes a minute or two: the name says what it waits for, the user judges.
NOT_STARTED_GRACE_SECONDS = 60.0
# What a waiting state may mean, where its reason alone does not say it.
HINTS = {
    "ContainerCreating": (
        "a volume that cannot mount (a claim not bound, a hostPath of the wrong type) waits here "
        "with a FailedMount event"
    ),
    "PodInitializing": "its init containers have not finished",
    "ImagePullBackOff": "the kubelet retries pulling the image",
}


def say_pods_not_starting(draft: Draft, pods: tuple[PodView, ...]) -> None:
    """Name an unschedulable pod, or else a container that has not started, once its grace is
    over; ask to be looked at again when a grace will be."""
    if _say_unschedulable(draft, pods):
        return
    waiting = [
        (p, _seconds(p.scheduled_since or p.created, draft.now, NOT_STARTED_GRACE_SECONDS))
        for p in pods
        if p.node and not p.running and not p.terminal and p.deleting_since is None
    ]
    stuck = [p for p, waited in waiting if waited >= NOT_STARTED_GRACE_SECONDS]
    if not stuck:
        if waiting:
            draft.requeue(NOT_STARTED_GRACE_SECONDS - max(w for _, w in waiting))
        return
    if _still_said(draft, ConditionReason.NOT_STARTED, stuck):
        return
    pod = stuck[-1]
    reason = pod.waiting_reason or "not started"
    since = pod.scheduled_since or pod.created
    message = f"pod {pod.name}: its container has not started on node {pod.node}"
    message += f" since {since.isoformat()}" if since is not None else ""
    message += f" ({reason}{': ' + pod.waiting_message if pod.waiting_message else ''})"
    if reason in HINTS:
        message += f"; {HINTS[reason]}: kubectl describe pod {pod.name}"
    draft.condition(ConditionType.RUNNING, False, ConditionReason.NOT_STARTED, message)


def _say_unschedulable(draft: Draft, pods: tuple[PodView, ...]) -> bool:
    """Name a pod the scheduler has not placed for `UNSCHEDULABLE_GRACE_SECONDS`; whether one
    is named. During a burst the scheduler often cannot place a pod at its first try (its cache
    behind the pods just bound), so a pod is named only after the grace."""
    waiting = [
        (p, _seconds(p.unschedulable_since or p.created, draft.now, UNSCHEDULABLE_GRACE_SECONDS))
        for p in pods
        if p.unschedulable_message
    ]
    stuck = [p for p, waited in waiting if waited >= UNSCHEDULABLE_GRACE_SECONDS]
    if not stuck:
        if waiting:
            draft.requeue(UNSCHEDULABLE_GRACE_SECONDS - max(w for _, w in waiting))
        return False
    if not _still_said(draft, ConditionReason.UNSCHEDULABLE, stuck):
        pod = stuck[-1]
        message = f"pod {pod.name}: {pod.unschedulable_message}"
        draft.condition(ConditionType.RUNNING, False, ConditionReason.UNSCHEDULABLE, message)
    return True


def _still_said(draft: Draft, reason: ConditionReason, stuck: list[PodView]) -> bool:
    """Whether the Running condition already names one of `stuck` for `reason`."""
    said = draft.status.condition(ConditionType.RUNNING)
    if said is None or said.reason != reason:
        return False
    return any((said.message or "").startswith(f"pod {p.name}: ") for p in stuck)


def _seconds(since: datetime | None, now: datetime, unknown: float) -> float:
    """Seconds since `since`; `unknown` (past the grace) when nothing says since when."""
    return (now - since).total_seconds() if since is not None else unknown
