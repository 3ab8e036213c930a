"""The doctor's word on each job that names a Kueue queue: admitted where, waiting since when,
preempted how often, or held because the operator runs without its Kueue integration. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tpujob.api import ConditionType, labels
from tpujob.api.reasons import ConditionReason
from tpujob.doctor.findings import Check, Finding, Level, Snapshot


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _held_without_kueue(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, Mapping)
        and c.get("type") == ConditionType.SUSPENDED
        and c.get("reason") == ConditionReason.WAITING_FOR_ADMISSION
        and "--kueue" in str(c.get("message") or "")
        for c in conditions
    )


def check_queues(snap: Snapshot) -> list[Finding]:
    findings = []
    for job in snap.jobs:
        meta, status = _map(job.get("metadata")), _map(job.get("status"))
        queue_name = _map(meta.get("labels")).get(labels.QUEUE_NAME)
        if not queue_name:
            continue
        subject = f"job {meta.get('namespace')}/{meta.get('name')}"
        queue = _map(status.get("queue"))
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        if _held_without_kueue(status):
            findings.append(
                Finding(
                    Check.QUEUES,
                    Level.WARNING,
                    subject,
                    f"names Kueue queue {queue_name}, but the operator runs without its Kueue "
                    "integration: the job waits",
                    "helm upgrade ... --set kueue.enabled=true (tpujob operator --kueue), with "
                    "TPUTrainingJob.v1alpha1.tpujob.dev in Kueue's externalFrameworks",
                )
            )
            continue
        evictions = queue.get("evictions") or 0
        evicted = f"; evicted {evictions}x, last: {queue.get('lastEviction')}" if evictions else ""
        if queue.get("admitted"):
            message = f"queue {queue_name}: admitted by ClusterQueue {queue.get('clusterQueue')}"
            findings.append(Finding(Check.QUEUES, Level.OK, subject, message + evicted))
            continue
        since = queue.get("waitingSince") or "?"
        findings.append(
            Finding(
                Check.QUEUES,
                Level.INFO,
                subject,
                f"queue {queue_name}: waiting for admission since {since}{evicted}",
                f"kubectl get workloads -n {meta.get('namespace')}; kubectl describe "
                f"localqueue {queue_name} -n {meta.get('namespace')} (quota, priority)",
            )
        )
    return findings
