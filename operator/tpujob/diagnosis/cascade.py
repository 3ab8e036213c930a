"""Diagnosis of a job: find the root worker of a cascade, then apply the history guards.

When one worker dies, its peers fail too, each with an error that only says a peer went
away ("Connection closed by peer", "Task 1 heartbeat timeout", "Shutdown barrier has
failed"). The root is the worker whose error is not such a consequence, earliest first;
the others become the tail of the error chain. Then two guards look at the job's history:
the same signature at the same step twice in a row is deterministic (fatal), and unknown
failures are retried only a bounded number of times. Pure: `now` is not even needed, the
facts carry their own times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime

from tpujob.diagnosis import facts as f
from tpujob.diagnosis.engine import diagnose_worker, worker_label
from tpujob.diagnosis.history import PastFailure
from tpujob.diagnosis.model import (
    DEFAULT_ACTIONS,
    ChainLink,
    Confidence,
    Diagnosis,
    Evidence,
    FailureClass,
    FailureCode,
    Source,
)
from tpujob.diagnosis.rules import RuleTable, UserRule
from tpujob.diagnosis.site import SiteRule
from tpujob.diagnosis.texts import admitted

DEFAULT_UNKNOWN_RETRY_LIMIT = 3
# The most workers of one failure that are diagnosed (and whose log tails are read). A slice of
# 1,536 hosts failing on every worker took 14 s to diagnose whole, over the planning budget.
# The root of a cascade fails first and the others after it, so it is among the earliest to
# finish, or among those that never finished (a worker lost with its node has no exit): those
# are read first. The rest are counted in the summary, not read.
MAX_DIAGNOSED_WORKERS = 64
# Failures caused from outside the program: repeating at the same step proves nothing.
EXTERNAL_CODES = frozenset(
    {
        FailureCode.PREEMPTED,
        FailureCode.MAINTENANCE,
        FailureCode.EVICTED,
        FailureCode.NODE_LOST,
        FailureCode.UNSCHEDULABLE,
        FailureCode.CAPACITY_UNAVAILABLE,
        FailureCode.TPU_UNHEALTHY,
    }
)
_LATEST = datetime.max.replace(tzinfo=UTC)


def _finish_key(worker: f.WorkerFacts) -> datetime:
    finished = worker.finished_at
    if finished is None:
        return _LATEST
    return finished if finished.tzinfo else finished.replace(tzinfo=UTC)


def sample_key(finished: datetime | None) -> tuple[bool, datetime]:
    """Which failed workers are read first: those with no exit, then the earliest to exit."""
    if finished is None:
        return (False, _LATEST)
    return (True, finished if finished.tzinfo else finished.replace(tzinfo=UTC))


def earliest_failed(workers: Sequence[f.WorkerFacts]) -> Sequence[f.WorkerFacts]:
    """The `MAX_DIAGNOSED_WORKERS` of `workers` that never finished or finished first (all of
    them when that many or fewer), in their given order."""
    if len(workers) <= MAX_DIAGNOSED_WORKERS:
        return workers
    order = sorted(range(len(workers)), key=lambda i: (sample_key(workers[i].finished_at), i))
    keep = set(order[:MAX_DIAGNOSED_WORKERS])
    return [w for i, w in enumerate(workers) if i in keep]


def pick_root(workers: Sequence[f.WorkerFacts], diagnoses: Sequence[Diagnosis]) -> int:
    """Index of the root worker: not a consequence first, then earliest, then lowest index."""

    def key(i: int) -> tuple[bool, datetime, int]:
        index = workers[i].worker_index
        return (diagnoses[i].consequence, _finish_key(workers[i]), index if index else 0)

    return min(range(len(workers)), key=key)


def _without_workers(
    heartbeat: f.HeartbeatFacts | None,
    user_rules: Sequence[UserRule],
    site_rules: Sequence[SiteRule],
    table: RuleTable | None,
) -> Diagnosis:
    """No worker failed: a stalled heartbeat is a hang, anything else is unknown."""
    worker = f.WorkerFacts(heartbeat=heartbeat, step=heartbeat.step if heartbeat else None)
    return diagnose_worker(worker, user_rules=user_rules, site_rules=site_rules, table=table)


def _escalate(
    diagnosis: Diagnosis,
    code: FailureCode,
    summary: str,
    evidence: Evidence,
    *,
    failure_class: FailureClass = FailureClass.FATAL,
    advice: str = "",
) -> Diagnosis:
    return dataclasses.replace(
        diagnosis,
        failure_class=failure_class,
        code=code,
        summary=summary,
        confidence=Confidence.HIGH,
        evidence=(*diagnosis.evidence, evidence),
        action=DEFAULT_ACTIONS[failure_class],
        advice=advice or diagnosis.advice,
    )


# Failures with a recovery budget of their own: a non-finite loss rolls back and skips its
# data window at most spec.recovery.maxNanRollbacks times, then fails with advice; the repeat
# guard must not end it sooner.
OWN_BUDGET_CODES = frozenset({FailureCode.NAN_LOSS})


def apply_history(
    diagnosis: Diagnosis,
    history: Sequence[PastFailure],
    *,
    node_name: str = "",
    unknown_retry_limit: int = DEFAULT_UNKNOWN_RETRY_LIMIT,
) -> Diagnosis:
    """Escalate a diagnosis that the job's earlier failures show to be deterministic."""
    if not history or not diagnosis.failure_class.retrying:
        return diagnosis
    if diagnosis.code in OWN_BUDGET_CODES:
        return diagnosis  # a rollback past the window is expected to meet the same step again
    last = history[-1]
    if (
        diagnosis.code not in EXTERNAL_CODES
        and diagnosis.step is not None
        and last.step == diagnosis.step
        and last.signature == diagnosis.signature
    ):
        return _escalate(
            diagnosis,
            FailureCode.DETERMINISTIC_REPEAT,
            f"deterministic repeat: the same failure ({diagnosis.code}) happened twice in a row"
            f" at step {diagnosis.step}: {diagnosis.summary}",
            Evidence(Source.HISTORY, f"previous failure {last.signature} at step {last.step}"),
            advice=diagnosis.advice or "fix the cause shown in the evidence before resubmitting",
        )
    if diagnosis.code is FailureCode.UNKNOWN:
        unknown = 0
        for prior in reversed(history):
            if prior.code is not FailureCode.UNKNOWN:
                break
            unknown += 1
        if unknown >= unknown_retry_limit:
            return _escalate(
                diagnosis,
                FailureCode.UNKNOWN_RETRY_LIMIT,
                f"unknown failure repeated {unknown + 1} times; giving up after"
                f" {unknown_retry_limit} retries",
                Evidence(Source.HISTORY, f"{unknown} unknown failures in a row before this"),
                advice="read the worker logs; add a recovery rule if the failure is retryable",
            )
    if (
        diagnosis.code is FailureCode.DEVICE_BUSY
        and diagnosis.failure_class is not FailureClass.HARD
        and node_name
        and any(p.code is FailureCode.DEVICE_BUSY and p.node == node_name for p in history)
    ):
        return _escalate(
            diagnosis,
            FailureCode.DEVICE_BUSY,
            f"the TPU on node {node_name} is busy again: a foreign process holds it",
            Evidence(Source.HISTORY, f"DEVICE_BUSY before on node {node_name}"),
            failure_class=FailureClass.HARD,
        )
    return diagnosis


def diagnose_job(
    job: f.JobFacts,
    *,
    user_rules: Sequence[UserRule] = (),
    site_rules: Sequence[SiteRule] = (),
    history: Sequence[PastFailure] = (),
    unknown_retry_limit: int = DEFAULT_UNKNOWN_RETRY_LIMIT,
    table: RuleTable | None = None,
) -> Diagnosis:
    """Diagnose a job attempt from all its failed workers and its history (oldest first).

    `site_rules` are the cluster's regrades (`site.py`), tried after the job's own rules."""
    if not job.workers:
        alone = _without_workers(job.heartbeat, user_rules, site_rules, table)
        return apply_history(alone, history, unknown_retry_limit=unknown_retry_limit)
    # Admitted once here: the summary and the root's node name below come from these too.
    unread = max(0, len(job.workers) - MAX_DIAGNOSED_WORKERS)
    job = dataclasses.replace(job, workers=tuple(admitted(w) for w in earliest_failed(job.workers)))
    diagnoses = [
        diagnose_worker(w, user_rules=user_rules, site_rules=site_rules, table=table)
        for w in job.workers
    ]
    root_at = pick_root(job.workers, diagnoses)
    root_worker, root = job.workers[root_at], diagnoses[root_at]
    others = [
        ChainLink(f"then {d.summary}" if d.consequence else d.summary, w.worker_index, d.code)
        for i, (w, d) in enumerate(zip(job.workers, diagnoses, strict=True))
        if i != root_at
    ]
    summary = f"{worker_label(root_worker)}: {root.summary}"
    if others or unread:
        count = len(others) + unread
        summary += f" ({count} other worker{'s' if count > 1 else ''} failed after)"
    step = root.step
    if step is None:
        step = next((d.step for d in diagnoses if d.step is not None), None)
    combined = dataclasses.replace(root, summary=summary, chain=(*root.chain, *others), step=step)
    node_name = root_worker.node_name or (root_worker.node.name if root_worker.node else "")
    return apply_history(
        combined, history, node_name=node_name, unknown_retry_limit=unknown_retry_limit
    )
