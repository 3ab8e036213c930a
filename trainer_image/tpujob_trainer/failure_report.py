"""The supervisor's report of a training process that ended, written on the heartbeat Lease.

A pod whose training process failed used to end with it, and the kubelet's record of the end
(exit code, reason, termination message) was how the operator learnt of the failure; the only
recovery then was a new pod. The supervisor instead keeps the pod and reports the end under
`contract.failure_annotation(slice, worker)` on the job's heartbeat Lease, which the trainer
may already patch: the operator diagnoses it as it would the terminated container and, for a
transient failure on a healthy node, restarts the process in the same pod with a rejoin order.
A report that cannot be written (no API access, the kubernetes client missing from a user's
own image, a refused patch) leaves the supervisor to end the pod as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tpujob_trainer.contract import (
    ENV_HEARTBEAT_LEASE,
    ENV_JOB_UID,
    ENV_NAMESPACE,
    ENV_TERMINATION_MESSAGE_PATH,
    MAX_MESSAGE_BYTES,
    TERMINATION_MESSAGE_PATH,
    FailureReport,
    encode_failure_report,
    failure_annotation,
)

log = logging.getLogger(__name__)

ENV_SLICE = "MEGASCALE_SLICE_ID"  # set by the operator on every trainer pod
ENV_WORKER = "TPU_WORKER_ID"
# The container's OOM kill count, cgroup v2 then v1: a child the kernel's OOM killer ended
# leaves the supervisor running, so no kubelet would say OOMKilled; the count does.
OOM_COUNTERS = (
    Path("/sys/fs/cgroup/memory.events"),
    Path("/sys/fs/cgroup/memory/memory.oom_control"),
)

Reporter = Callable[[FailureReport], bool]


def oom_kills(counters: tuple[Path, ...] = OOM_COUNTERS) -> int | None:
    """The container's OOM kill count; None where no cgroup file says it."""
    for path in counters:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return None


def termination_message(env: Mapping[str, str]) -> str:
    path = Path(env.get(ENV_TERMINATION_MESSAGE_PATH) or TERMINATION_MESSAGE_PATH)
    try:
        with path.open("rb") as handle:
            return handle.read(MAX_MESSAGE_BYTES).decode(errors="replace")
    except OSError:
        return ""


def report_of(
    env: Mapping[str, str],
    *,
    attempt: int,
    returncode: int,
    oom_before: int | None,
    oom_after: int | None,
    now: datetime | None = None,
) -> FailureReport:
    """The report of a child that returned `returncode` (negative: killed by that signal)."""
    signal = -returncode if returncode < 0 else None
    oom = oom_before is not None and oom_after is not None and oom_after > oom_before
    return FailureReport(
        attempt=attempt,
        job_uid=env.get(ENV_JOB_UID, ""),
        exit_code=128 + signal if signal is not None else returncode,
        signal=signal,
        reason="OOMKilled" if oom else "Error",
        message=termination_message(env),
        at=(now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


@dataclass(frozen=True)
class LeaseReporter:
    """`Reporter` that patches the job's heartbeat Lease through the kubernetes client."""

    lease: str
    namespace: str
    slice_index: int
    worker: int

    def __call__(self, report: FailureReport) -> bool:
        key = failure_annotation(self.slice_index, self.worker)
        body = {"metadata": {"annotations": {key: encode_failure_report(report)}}}
        try:
            from tpujob_trainer.heartbeat import KubernetesLeaseClient

            KubernetesLeaseClient().patch_lease(self.lease, self.namespace, body)
        except Exception as err:
            log.warning("could not report the failure on the Lease (%s); ending the pod", err)
            return False
        log.warning("reported exit %d on the Lease as %s", report.exit_code, key)
        return True


def lease_reporter(env: Mapping[str, str]) -> LeaseReporter | None:
    """The reporter the pod's environment allows; None when it lacks what a report needs."""
    try:
        slice_index, worker = int(env.get(ENV_SLICE, "")), int(env.get(ENV_WORKER, ""))
    except ValueError:
        return None
    lease, namespace = env.get(ENV_HEARTBEAT_LEASE), env.get(ENV_NAMESPACE)
    if not lease or not namespace or not env.get(ENV_JOB_UID):
        return None
    return LeaseReporter(lease, namespace, slice_index, worker)
