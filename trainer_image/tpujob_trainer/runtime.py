"""Setting up one process of a job: join the JAX system, check devices, heartbeat, checkpoints.

Shared by the reference trainer and the SDK (`sdk.Job`), so a user's loop gets exactly the
behaviour the operator is tested against. Each function does one piece of I/O and logs it.
"""

from __future__ import annotations

import logging
import os
import threading
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING

from tpujob_trainer.compile_cache import CacheUse, watch
from tpujob_trainer.config import TrainerConfig
from tpujob_trainer.failures import FailureContext
from tpujob_trainer.faults import restore_error_from
from tpujob_trainer.fencing import SaveGate
from tpujob_trainer.heartbeat import Heartbeat, KubernetesLeaseClient, LeaseClient, announce_patch
from tpujob_trainer.preflight import check_devices, probe_jax

if TYPE_CHECKING:
    from tpujob_trainer.checkpointing import Checkpoints
    from tpujob_trainer.tiers import TieredCheckpoints

log = logging.getLogger("tpujob_trainer")

# Steps the local tier keeps: the newest, and the one before it while the next is written.
LOCAL_KEEP = 2


class Loop:
    """What every training loop keeps: its config, how far it got, and the SIGTERM flag.

    `context` always says how far the run got, so a failure's termination message carries the
    step and the committed checkpoint step (`step_driver.StepDriver` keeps it up to date while
    stepping). Install `on_sigterm` as the SIGTERM handler.
    """

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        self.context = FailureContext(worker=config.process_id)
        self.stop_requested = threading.Event()
        # Set by `join` for a JAX loop whose compilation cache is on; logged after the first step.
        self.compile_cache: CacheUse | None = None

    def on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        """Only async-signal-safe work here; the loop saves and stops after the current step."""
        self.stop_requested.set()
        os.write(2, f"tpujob-trainer: received signal {signum}, saving and stopping\n".encode())


def join(config: TrainerConfig) -> CacheUse | None:
    """Configure JAX for this job and join its distributed system when there is one; what the
    persistent compilation cache does from now on (None: no cache folder)."""
    import jax

    # gloo makes the CPU backend's collectives real sockets between processes, so a dead
    # peer breaks the survivors' collective as it would on a TPU slice.
    jax.config.update(  # type: ignore[no-untyped-call]
        "jax_cpu_collectives_implementation", "gloo"
    )
    cache = watch()
    distributed = config.distributed
    if distributed is None:
        return cache
    timeout = config.collective_timeout_seconds
    log.info(
        "joining job: process %d of %d, coordinator %s, heartbeat timeout %ds",
        distributed.process_id,
        distributed.num_processes,
        distributed.coordinator_address,
        timeout,
    )
    jax.distributed.initialize(
        coordinator_address=distributed.coordinator_address,
        num_processes=distributed.num_processes,
        process_id=distributed.process_id,
        initialization_timeout=max(120, 6 * timeout),
        heartbeat_timeout_seconds=timeout,
        shutdown_timeout_seconds=timeout,
    )
    return cache


def preflight(config: TrainerConfig) -> str:
    """Check the devices against what the job asked for; the backend, or TrainerError."""
    import jax

    probe = probe_jax(config.expect_tpu_chips_per_host > 0)
    log.info(
        "devices: backend=%s local=%d global=%d kinds=%s jax=%s",
        probe.backend,
        probe.local_devices,
        jax.device_count(),
        ",".join(probe.device_kinds),
        jax.__version__,
    )
    return check_devices(
        probe,
        expect_chips=config.expect_tpu_chips_per_host,
        allow_cpu_fallback=config.allow_cpu_fallback,
    )


class _NoCredentials:
    """A LeaseReader for a run whose Lease is configured but whose credentials are not: every
    read fails, so fencing fails closed and no save commits (and the log says why)."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    def read_lease_annotations(self, name: str, namespace: str) -> dict[str, str]:
        raise PermissionError(f"no Kubernetes credentials: {self._reason}")


def lease_client(config: TrainerConfig) -> KubernetesLeaseClient | _NoCredentials | None:
    """The Lease's client when a Lease is configured; None outside the operator."""
    if config.heartbeat_lease is None:
        return None
    try:
        return KubernetesLeaseClient()
    except Exception as error:
        log.warning(
            "heartbeat disabled and saves fenced off: no Kubernetes credentials (%s)", error
        )
        return _NoCredentials(str(error))


def announce(config: TrainerConfig, client: LeaseClient | None = None) -> bool:
    """Worker 0 tells the operator, before the slow start (importing the framework, joining,
    compiling), that this attempt speaks the heartbeat contract: from then on a trainer that
    stops beating is hung. Whether it was told; a failure is logged, never raised."""
    lease = config.heartbeat_lease
    if lease is None or config.process_id != 0:
        return False
    try:
        client = client or KubernetesLeaseClient()
        client.patch_lease(
            lease,
            config.namespace,
            announce_patch(
                config.attempt, datetime.now(UTC), config.job_uid, rejoins=config.rejoins
            ),
        )
    except Exception as error:
        # The job still trains; the operator only cannot tell a hang at start-up.
        log.warning("heartbeat: announcing on lease %s failed: %s", lease, error)
        return False
    return True


def heartbeat(
    config: TrainerConfig, client: KubernetesLeaseClient | _NoCredentials | None
) -> Heartbeat | None:
    """Worker 0's started heartbeat, or None (other workers, no Lease, no credentials)."""
    lease = config.heartbeat_lease
    if lease is None or config.process_id != 0 or not isinstance(client, KubernetesLeaseClient):
        return None
    beat = Heartbeat(client, name=lease, namespace=config.namespace, job_uid=config.job_uid)
    beat.start()
    return beat


def save_gate(
    config: TrainerConfig, client: KubernetesLeaseClient | _NoCredentials | None
) -> SaveGate | None:
    """The fencing gate of every save; None (fencing off) when no Lease is configured."""
    if config.heartbeat_lease is None or client is None:
        return None
    from tpujob_trainer.collectives import gather_ints

    return SaveGate(
        client,
        lease=config.heartbeat_lease,
        namespace=config.namespace,
        attempt=config.attempt,
        gather=gather_ints,
        job_uid=config.job_uid,
    )


def open_checkpoints(
    config: TrainerConfig, gate: SaveGate | None
) -> Checkpoints | TieredCheckpoints | None:
    """The job's checkpoints (fenced by `gate`), or None without a checkpoint directory;
    with a local tier as well when the pod has one (`tiers`)."""
    if not config.checkpoint_dir:
        log.warning("no checkpoint directory: progress is lost if this process stops")
        return None
    from tpujob_trainer.checkpointing import Checkpoints

    tiered = config.local_checkpoint_dir is not None
    persistent = Checkpoints(
        config.checkpoint_dir,
        keep=config.keep,
        attempt=config.attempt,
        # With tiers the gate is asked once per step, for both tiers, by `TieredCheckpoints`.
        gate=None if tiered else gate,
        read_error_from=restore_error_from(
            config.faults, worker=config.process_id, attempt=config.attempt
        ),
    )
    if config.local_checkpoint_dir is None:
        return persistent
    from tpujob_trainer.local_tier import LocalTier
    from tpujob_trainer.tiers import TieredCheckpoints

    log.info(
        "local checkpoint tier %s: every %d steps (persistent every %d)",
        config.local_checkpoint_dir,
        config.local_checkpoint_interval,
        config.checkpoint_interval,
    )
    local = LocalTier(
        config.local_checkpoint_dir, keep=LOCAL_KEEP, attempt=config.attempt, job_uid=config.job_uid
    )
    return TieredCheckpoints(
        persistent,
        local,
        gate=gate,
        process_index=config.process_id,
        recheck_steps=config.checkpoint_interval,
    )
