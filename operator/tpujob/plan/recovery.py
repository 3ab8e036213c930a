"""What to do about a diagnosed failure: the recovery policy as a pure function.

`decide` maps (diagnosis, the job's spec and status, what is broken) to a `Decision`: fail
the job (fatal, recovery off, a budget spent) or start the next attempt, with the class's
adjustments. The checks run in a fixed order, first match wins, and the restart itself is the
one named default: fatal -> non-finite loss rollbacks spent -> autoRecovery off -> class
budget -> failed-node budget -> the last attempt a job may have -> restart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tpujob import diagnosis as dx
from tpujob.api import FailureClass, TPUTrainingJob
from tpujob.api import constants as c
from tpujob.api.reasons import FailReason
from tpujob.plan.rollback import NAN_ADVICE

# Codes of the hard class that do not mean the node is broken: the node is taken away (a
# maintenance event, a preemption), so the slice moves but the node is not blamed.
NOT_THE_NODES_FAULT = frozenset(
    {dx.FailureCode.MAINTENANCE, dx.FailureCode.PREEMPTED, dx.FailureCode.EVICTED}
)
# Codes after which the old pods get their full grace period so the trainer can save.
GRACEFUL_CODES = frozenset(
    {
        dx.FailureCode.MAINTENANCE,
        dx.FailureCode.PREEMPTED,
        dx.FailureCode.EVICTED,
        dx.FailureCode.HANG,
    }
)
MAX_COLLECTIVE_TIMEOUT_SECONDS = 3600


@dataclass(frozen=True)
class FailJob:
    reason: FailReason
    message: str


@dataclass(frozen=True)
class Restart:
    failure_class: FailureClass
    delay_seconds: int
    move_slices: frozenset[int]
    blame_nodes: tuple[str, ...]  # this job's failed nodes (avoided, counted)
    graceful: bool
    collective_timeout_seconds: int
    mark_nodes: tuple[str, ...] = ()  # those of blame_nodes marked bad for every job


Decision = FailJob | Restart


@dataclass(frozen=True)
class Broken:
    """What the failure broke: nodes that are unusable now and the slices they held."""

    lost_nodes: tuple[str, ...]  # lost or with unhealthy TPUs: blamed on a hard failure
    moving_nodes: tuple[str, ...]  # taken away (maintenance): the slice moves, no blame
    slices: frozenset[int]  # slices with a node of either kind
    root_node: str | None
    root_slice: int | None
    # Nodes that the cross-namespace ledger blames (soft failures of other tenants' jobs on
    # them): evidence no one job's author controls, so the node is marked for everyone.
    history_nodes: tuple[str, ...] = ()
    # Nodes only this job's own history blames (its failure recurring on one node): this job
    # avoids them and counts them against its budget, but they are not marked for the others.
    # A job's author controls how its program fails, and so whether it "recurs on one node";
    # that alone must not get a node tainted (the ledger can, across tenants).
    job_nodes: tuple[str, ...] = ()


def _fatal(d: dx.Diagnosis, job: TPUTrainingJob, broken: Broken) -> FailJob | None:
    if d.failure_class is not dx.FailureClass.FATAL:
        return None
    advice = f" {d.advice}" if d.advice else ""
    return FailJob(FailReason.FATAL, f"{d.headline}.{advice}")


def _nan_rollbacks(d: dx.Diagnosis, job: TPUTrainingJob, broken: Broken) -> FailJob | None:
    if d.code is not dx.FailureCode.NAN_LOSS:
        return None
    done, allowed = job.status.nan_rollbacks or 0, job.spec.recovery.max_nan_rollbacks
    if done < allowed:
        return None
    return FailJob(
        FailReason.NON_FINITE_LOSS,
        f"{d.headline}; non-finite again after {done} rollbacks "
        f"(spec.recovery.maxNanRollbacks={allowed}): {NAN_ADVICE}",
    )


def _auto_recovery(d: dx.Diagnosis, job: TPUTrainingJob, broken: Broken) -> FailJob | None:
    if job.spec.recovery.auto_recovery:
        return None
    return FailJob(
        FailReason.AUTO_RECOVERY_OFF,
        f"{d.headline}; spec.recovery.autoRecovery is false, so the job is not restarted",
    )


def _class_budget(d: dx.Diagnosis, job: TPUTrainingJob, broken: Broken) -> FailJob | None:
    cls = FailureClass(str(d.failure_class))
    allowed = job.spec.recovery.budget(cls)
    used = job.status.restarts.count(cls)
    if used < allowed:
        return None
    field = f"max{cls.value.capitalize()}Restarts"
    return FailJob(
        FailReason.RESTART_BUDGET,
        f"{d.headline}; the {cls.value} restart budget is spent "
        f"({used} of spec.recovery.{field}={allowed})",
    )


def _node_budget(d: dx.Diagnosis, job: TPUTrainingJob, broken: Broken) -> FailJob | None:
    blamed = blame(d, broken)
    known = {n.name for n in job.status.failed_nodes}
    total = len(known | set(blamed))
    budget = job.spec.max_failed_nodes_count()
    if total <= budget:
        return None
    return FailJob(
        FailReason.FAILED_NODE_BUDGET,
        f"{d.headline}; {total} nodes have failed, more than "
        f"spec.recovery.maxFailedNodes={job.spec.recovery.max_failed_nodes} "
        f"({budget} of {job.spec.tpu.total_hosts} hosts)",
    )


def _attempts(d: dx.Diagnosis, job: TPUTrainingJob, broken: Broken) -> FailJob | None:
    # The restart budgets keep a job far below the bound; a status that says otherwise (an
    # attempt written by hand, up to the CRD's int64) must not get attempt + 1 written, which
    # past c.MAX_ATTEMPT no heartbeat can match and past int64 the apiserver refuses.
    if job.status.attempt < c.MAX_ATTEMPT:
        return None
    return FailJob(FailReason.RESTART_BUDGET, f"{d.headline}; {no_attempt_left(job)}")


def no_attempt_left(job: TPUTrainingJob, then: str = "restarted") -> str:
    """Why the job gets no next attempt (`then`: what it would have been)."""
    return (
        f"attempt {job.status.attempt} is the last a job may have "
        f"({c.MAX_ATTEMPT} attempts at most), so the job is not {then}"
    )


CHECKS: tuple[Callable[[dx.Diagnosis, TPUTrainingJob, Broken], FailJob | None], ...] = (
    _fatal,
    _nan_rollbacks,
    _auto_recovery,
    _class_budget,
    _node_budget,
    _attempts,
)


def blame(d: dx.Diagnosis, broken: Broken) -> tuple[str, ...]:
    """Nodes a hard failure is blamed on (this job's failed nodes): only on evidence.

    That is the node's own state (lost, TPUs unhealthy), the cross-namespace ledger, or the
    job's own history (the failure recurs on that node; this job avoids the node, `marks`
    leaves it unmarked for the others). A hard grade from the trainer's self-report, a user's
    rule or the text model moves the slice but blames no node: a job's author must not be able
    to get a node tainted.
    """
    if d.failure_class is not dx.FailureClass.HARD or d.code in NOT_THE_NODES_FAULT:
        return ()
    return tuple(dict.fromkeys((*broken.lost_nodes, *broken.history_nodes, *broken.job_nodes)))


def marks(d: dx.Diagnosis, broken: Broken) -> tuple[str, ...]:
    """Of the blamed nodes, those marked bad for every job (`Broken.job_nodes` are not)."""
    shared = {*broken.lost_nodes, *broken.history_nodes}
    return tuple(n for n in blame(d, broken) if n in shared)


def collective_timeout(base_seconds: int, medium_restarts: int) -> int:
    """Medium retries double the collective timeout each time (up to an hour)."""
    # The count is the status's, any int64 the CRD admits: past a dozen doublings the hour is
    # reached, and 2 ** count itself would keep the planner computing (and growing) for ever.
    doublings = min(max(0, medium_restarts), MAX_COLLECTIVE_TIMEOUT_SECONDS.bit_length())
    return int(min(MAX_COLLECTIVE_TIMEOUT_SECONDS, base_seconds * 2**doublings))


def decide(
    d: dx.Diagnosis, job: TPUTrainingJob, broken: Broken, *, base_collective_timeout: int
) -> Decision:
    for check in CHECKS:
        verdict = check(d, job, broken)
        if verdict is not None:
            return verdict
    cls = FailureClass(str(d.failure_class))
    restarts = job.status.restarts
    move = set(broken.slices)
    if cls is FailureClass.HARD and broken.root_slice is not None:
        move.add(broken.root_slice)
    medium = restarts.medium + (1 if cls is FailureClass.MEDIUM else 0)
    return Restart(
        failure_class=cls,
        delay_seconds=job.spec.recovery.backoff.delay(restarts.medium)
        if cls is FailureClass.MEDIUM
        else 0,
        move_slices=frozenset(move),
        blame_nodes=blame(d, broken),
        mark_nodes=marks(d, broken),
        graceful=d.code in GRACEFUL_CODES,
        collective_timeout_seconds=collective_timeout(base_collective_timeout, medium),
    )
