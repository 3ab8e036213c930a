"""The progress heartbeat: worker 0 renews a coordination.k8s.io/v1 Lease while steps complete.

The training loop calls `Heartbeat.progress(...)` after each step (cheap: it only records the
numbers). A background thread calls `renew_if_due()`, which patches the Lease only when a step
completed since the last renewal and at most once per `min_interval` seconds. So a hung step
really stops the heartbeat, which is how the operator tells a hung run from a slow one. Errors
from the API are logged and never reach training. The Lease client and the clock are injected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from tpujob_trainer.contract import (
    HEARTBEAT_ATTEMPT,
    HEARTBEAT_CHECKPOINT_STEP,
    HEARTBEAT_HEALTH_STEP,
    HEARTBEAT_INPUT_BOUND_FRACTION,
    HEARTBEAT_JOB_UID,
    HEARTBEAT_LOCAL_CHECKPOINT_STEP,
    HEARTBEAT_LOSS,
    HEARTBEAT_REJOINS,
    HEARTBEAT_SAVE_SECONDS,
    HEARTBEAT_STEP,
    HEARTBEAT_STEPS_PER_SECOND,
    HEARTBEAT_TOTAL_STEPS,
    HEARTBEAT_WORKER_INPUT_BOUND,
    HEARTBEAT_WORKER_RSS_BYTES,
    HEARTBEAT_WORKER_STEP_SECONDS,
)
from tpujob_trainer.health import Health

log = logging.getLogger(__name__)


class LeaseClient(Protocol):
    """The one call the heartbeat needs: a merge patch of a namespaced Lease."""

    def patch_lease(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        """Apply `body` to the Lease."""


# Bounds every API call, so a partitioned apiserver costs one timeout, never a stuck thread.
REQUEST_TIMEOUT_SECONDS = 5.0


class KubernetesLeaseClient:
    """`LeaseClient` and fencing's `LeaseReader` over the kubernetes client.

    Credentials: in-cluster, else KUBECONFIG.
    """

    def __init__(self) -> None:
        from kubernetes import client, config

        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        self._api = client.CoordinationV1Api()

    def patch_lease(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        """Merge-patch the Lease; the operator created it and granted `patch` on it alone."""
        self._api.patch_namespaced_lease(
            name,
            namespace,
            body,
            _content_type="application/merge-patch+json",
            _request_timeout=REQUEST_TIMEOUT_SECONDS,
        )

    def read_lease_annotations(self, name: str, namespace: str) -> Mapping[str, str]:
        """The Lease's annotations; the operator granted `get` on it."""
        lease = self._api.read_namespaced_lease(
            name, namespace, _request_timeout=REQUEST_TIMEOUT_SECONDS
        )
        annotations = lease.metadata.annotations if lease.metadata else None
        return {str(k): str(v) for k, v in (annotations or {}).items()}


@dataclass(frozen=True)
class Progress:
    """The numbers one renewal publishes."""

    step: int
    total_steps: int
    loss: float
    steps_per_second: float
    checkpoint_step: int | None
    attempt: int
    health: Health | None = None
    rejoins: bool = False
    save_seconds: float | None = None
    local_checkpoint_step: int | None = None


def health_annotations(health: Health) -> dict[str, str]:
    """The Lease annotations of one health gather (per-worker values comma-separated)."""
    return {
        HEARTBEAT_HEALTH_STEP: str(health.step),
        HEARTBEAT_INPUT_BOUND_FRACTION: f"{health.input_bound_fraction:.4f}",
        HEARTBEAT_WORKER_INPUT_BOUND: ",".join(f"{v:.4f}" for v in health.worker_input_bound),
        HEARTBEAT_WORKER_STEP_SECONDS: ",".join(f"{v:.4f}" for v in health.worker_step_seconds),
        HEARTBEAT_WORKER_RSS_BYTES: ",".join(str(v) for v in health.worker_rss_bytes),
    }


def lease_patch(progress: Progress, now: datetime, job_uid: str | None = None) -> dict[str, Any]:
    """The merge patch for one renewal: renewTime is the heartbeat, annotations the numbers,
    signed with the uid of the job this trainer belongs to when it knows it."""
    return {
        "metadata": {
            "annotations": {
                HEARTBEAT_STEP: str(progress.step),
                HEARTBEAT_TOTAL_STEPS: str(progress.total_steps),
                HEARTBEAT_LOSS: f"{progress.loss:.6g}",
                HEARTBEAT_STEPS_PER_SECOND: f"{progress.steps_per_second:.3g}",
                HEARTBEAT_CHECKPOINT_STEP: (
                    "" if progress.checkpoint_step is None else str(progress.checkpoint_step)
                ),
                HEARTBEAT_ATTEMPT: str(progress.attempt),
                HEARTBEAT_REJOINS: "true" if progress.rejoins else "false",
                **({HEARTBEAT_JOB_UID: job_uid} if job_uid else {}),
                # Empty, not left out: a merge patch would keep an earlier attempt's value,
                # from a local tier that went with its pods.
                HEARTBEAT_LOCAL_CHECKPOINT_STEP: (
                    ""
                    if progress.local_checkpoint_step is None
                    else str(progress.local_checkpoint_step)
                ),
                **(
                    {HEARTBEAT_SAVE_SECONDS: f"{progress.save_seconds:.3g}"}
                    if progress.save_seconds is not None
                    else {}
                ),
                **(health_annotations(progress.health) if progress.health else {}),
            }
        },
        "spec": {"renewTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    }


def announce_patch(
    attempt: int, now: datetime, job_uid: str | None = None, *, rejoins: bool = False
) -> dict[str, Any]:
    """The merge patch that announces the contract for `attempt` before its first step.

    It clears the step an earlier attempt left, so the operator times this attempt's start-up
    and does not read that step as this attempt's progress.
    """
    return {
        "metadata": {
            "annotations": {
                HEARTBEAT_STEP: None,
                HEARTBEAT_ATTEMPT: str(attempt),
                HEARTBEAT_REJOINS: "true" if rejoins else "false",
                **({HEARTBEAT_JOB_UID: job_uid} if job_uid else {}),
            }
        },
        "spec": {"renewTime": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    }


class Heartbeat:
    """Rate-limited Lease renewal on progress; thread-safe; `start()`/`stop()` own the thread."""

    def __init__(
        self,
        client: LeaseClient,
        *,
        name: str,
        namespace: str,
        job_uid: str | None = None,
        min_interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._client = client
        self._name = name
        self._namespace = namespace
        self._job_uid = job_uid
        self._min_interval = min_interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._pending: Progress | None = None
        self._last_renewal: float | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.errors = 0

    def progress(self, progress: Progress) -> None:
        """Record that a step completed; the next due renewal publishes it."""
        with self._lock:
            self._pending = progress

    def renew_if_due(self, *, force: bool = False) -> bool:
        """Patch the Lease if a step completed since the last renewal and the interval passed.

        `force` skips the interval (not the need for progress): the last numbers of a run are
        published even when the run ends right after a renewal.
        """
        now = self._clock()
        with self._lock:
            if self._pending is None:
                return False
            last = self._last_renewal
            recent = last is not None and now - last < self._min_interval
            if recent and not force:
                return False
            progress, self._pending = self._pending, None
            self._last_renewal = now
        try:
            self._client.patch_lease(
                self._name,
                self._namespace,
                lease_patch(progress, self._wall_clock(), self._job_uid),
            )
        except Exception as error:
            # Any API or network error: training matters more than the heartbeat.
            self.errors += 1
            log.warning(
                "heartbeat: renewing lease %s/%s failed: %s", self._namespace, self._name, error
            )
            return False
        self.renewals += 1
        return True

    def start(self) -> None:
        """Renew from a daemon thread until `stop()`."""
        self._thread = threading.Thread(target=self._run, name="tpujob-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread, then publish the last progress if it is not published yet."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.renew_if_due(force=True)

    def _run(self) -> None:
        while not self._stopped.wait(self._min_interval / 4):
            self.renew_if_due()
