"""Checkpoint cadence advice: the configured interval against the Young/Daly optimum.

Pure; part of planning. Saving costs the steps a save holds the loop up; not saving costs, at
each failure, the steps since the last save. Young (1974) put the interval that minimises the
sum at sqrt(2 C M) for a save cost C and a mean time between failures M; Daly (2006) refined it
for saves that are not small against M. The trainer measures C (the mean seconds a save held
its loop up, on the heartbeat), the job's own history gives M (its wall time over its
restarts), and the heartbeat's rate turns seconds into steps.

What M can say decides what the condition says. With no failure yet, the job's wall time is
only a floor under M (and so under the optimum): the interval can be judged too short, never
too long. Before `MIN_OBSERVED_SECONDS` of the job's life, or without a measured save and rate,
nothing is said. The advice never changes the job; it is a condition and a line in `describe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tpujob.api import ConditionType, GoodputBreakdown
from tpujob.api.reasons import ConditionReason
from tpujob.observed.views import Observed
from tpujob.plan.result import Draft

# Within this factor of the optimum an interval is near it: the expected loss, C/T + T/(2M),
# is then at most 25% above its minimum.
FAR = 2.0
# A job's first minutes say little about its time between failures.
MIN_OBSERVED_SECONDS = 600.0


def young_daly(save_seconds: float, mtbf_seconds: float) -> float:
    """The optimal training time between two saves (Daly's higher-order form of Young's)."""
    c, m = save_seconds, mtbf_seconds
    if c >= 2 * m:
        return m
    ratio = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(ratio) / 3 + ratio / 9) - c


@dataclass(frozen=True)
class Cadence:
    """The configured interval and the optimum, in seconds of training, with what they rest on."""

    interval_steps: int
    interval_seconds: float
    optimum_seconds: float
    save_seconds: float
    mtbf_seconds: float
    failures: int
    steps_per_second: float

    @property
    def ratio(self) -> float:
        return self.interval_seconds / self.optimum_seconds if self.optimum_seconds else math.inf

    @property
    def optimum_steps(self) -> int:
        return max(1, round(self.optimum_seconds * self.steps_per_second))


def cadence(obs: Observed, parts: GoodputBreakdown) -> Cadence | None:
    """The job's cadence against the optimum, or None when there is not enough to judge by."""
    job, beat = obs.job, obs.heartbeat
    checkpoint = job.spec.checkpoint
    if checkpoint is None or beat is None or beat.attempt != job.status.attempt:
        return None
    rate, save = beat.steps_per_second, beat.save_seconds
    if not rate or not save or parts.wall_seconds < MIN_OBSERVED_SECONDS:
        return None
    failures = job.status.restarts.total
    mtbf = parts.wall_seconds / max(1, failures)
    return Cadence(
        interval_steps=checkpoint.interval_steps,
        interval_seconds=checkpoint.interval_steps / rate,
        optimum_seconds=young_daly(save, mtbf),
        save_seconds=save,
        mtbf_seconds=mtbf,
        failures=failures,
        steps_per_second=rate,
    )


def say_checkpoint_cadence(obs: Observed, draft: Draft, parts: GoodputBreakdown) -> None:
    """Set the CheckpointCadence condition when the job's numbers allow a judgement."""
    found = cadence(obs, parts)
    if found is None:
        return
    basis = (
        f"saving every {found.interval_steps} steps (~{_duration(found.interval_seconds)} of "
        f"training) costs {found.save_seconds:.2f}s a save; "
    )
    if found.failures:
        basis += (
            f"{found.failures} restart(s) in {_duration(parts.wall_seconds)} (one every "
            f"~{_duration(found.mtbf_seconds)})"
        )
    else:
        basis += f"no failure in {_duration(parts.wall_seconds)}"
    optimum = (
        f"the Young/Daly optimum is ~{_duration(found.optimum_seconds)}"
        f"{' or more' if not found.failures else ''} (about {found.optimum_steps} steps)"
    )
    set_it = f"{basis}: {optimum}; set spec.checkpoint.intervalSteps to about {found.optimum_steps}"
    if found.ratio < 1 / FAR:
        verdict, reason, message = False, ConditionReason.SAVES_TOO_OFTEN, set_it
    elif found.failures and found.ratio > FAR:
        verdict, reason, message = False, ConditionReason.SAVES_TOO_RARELY, set_it
    elif found.failures:
        verdict, reason, message = True, ConditionReason.NEAR_OPTIMUM, f"{basis}: {optimum}"
    else:
        verdict, reason = True, ConditionReason.NO_FAILURE_YET
        message = (
            f"{basis}: {optimum}, so saves are not too frequent; whether they are too rare "
            "shows once a failure does"
        )
    draft.condition(ConditionType.CHECKPOINT_CADENCE, verdict, reason, message)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
