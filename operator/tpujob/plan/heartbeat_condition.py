"""Whether the job is judged by its heartbeat, as the Heartbeat condition.

Pure; part of planning. Hang detection needs the trainer's heartbeat Lease, and a user's own
trainer may never write it: such a job is not restarted for being silent
(`tpujob.observed.trouble`), and this condition is where the user learns that its hangs go
unseen, and why.
"""

from __future__ import annotations

from datetime import datetime

from tpujob.api import ConditionStatus, ConditionType
from tpujob.api.reasons import ConditionReason
from tpujob.observed.views import Observed, PodView
from tpujob.plan.result import Draft

# The reference trainer and the SDK write the Lease within seconds of starting, before they
# import their framework; this long after every worker runs, a trainer that has not is taken
# not to speak the contract.
ANNOUNCE_GRACE_SECONDS = 120.0


def watch_heartbeat(obs: Observed, draft: Draft, pods: tuple[PodView, ...]) -> None:
    """Set the Heartbeat condition from the spec and the current attempt's Lease."""
    recovery = obs.job.spec.recovery
    if recovery.stall_timeout_seconds == 0:
        draft.condition(
            ConditionType.HEARTBEAT,
            False,
            ConditionReason.STALL_DETECTION_OFF,
            "spec.recovery.stallTimeoutSeconds is 0: a hung trainer is not detected; pod and "
            "node failures still are",
        )
        return
    beat = obs.heartbeat
    if beat is not None and beat.attempt == obs.job.status.attempt and beat.renewed is not None:
        draft.condition(
            ConditionType.HEARTBEAT,
            True,
            ConditionReason.ANNOUNCED,
            f"the trainer renews its heartbeat; no step for {recovery.stall_timeout_seconds}s"
            f" (or none {recovery.startup_timeout_seconds}s after its workers start) restarts it",
        )
        return
    started = [p.running_since for p in pods if p.running_since is not None]
    if not pods or len(started) < len(pods) or not all(p.running for p in pods):
        return
    if (draft.now - max(started)).total_seconds() < ANNOUNCE_GRACE_SECONDS:
        return
    was = draft.status.condition(ConditionType.HEARTBEAT)
    if was is not None and was.status == ConditionStatus.TRUE:
        # It spoke in an earlier attempt: this attempt's trainer is slow to start, not silent.
        return
    draft.condition(
        ConditionType.HEARTBEAT,
        False,
        ConditionReason.NOT_ANNOUNCED,
        "the trainer never wrote its heartbeat Lease ($TPUJOB_HEARTBEAT_LEASE), so a hung "
        "trainer is not detected; pod and node failures still are. The tpujob SDK "
        "(tpujob_trainer.sdk) writes it",
    )


def seconds_to_announce(obs: Observed, pods: tuple[PodView, ...], *, now: datetime) -> float | None:
    """How long until `watch_heartbeat` would judge the trainer silent, None when it has
    spoken, the judgement is off or due already, or its workers do not all run yet."""
    if obs.job.spec.recovery.stall_timeout_seconds == 0:
        return None
    beat = obs.heartbeat
    if beat is not None and beat.attempt == obs.job.status.attempt and beat.renewed is not None:
        return None
    started = [p.running_since for p in pods if p.running_since is not None]
    if not pods or len(started) < len(pods) or not all(p.running for p in pods):
        return None
    left = ANNOUNCE_GRACE_SECONDS - (now - max(started)).total_seconds()
    return left if left > 0 else None
