"""The JAX training run: join the job, check devices, resume, step, save, stop on SIGTERM.

`Trainer.run()` returns an exit code for the expected outcomes (OK, PREEMPTED) and raises for
everything else; `__main__` turns exceptions into the failure contract. `Trainer.context`
always says how far the run got, so a failure report carries the step and checkpoint step.

Lifecycle on SIGTERM: the handler only sets a flag. The next step carries the flag through the
step's own collective (see `model.make_train_step`), so every process learns it in the same step;
they all save that step, wait for the save to commit, and return PREEMPTED.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import replace
from types import FrameType

import numpy as np

from tpujob_trainer import model
from tpujob_trainer.config import TrainerConfig
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.data import IN_FEATURES, make_batch
from tpujob_trainer.failures import FailureContext
from tpujob_trainer.faults import FaultKind, due
from tpujob_trainer.heartbeat import Heartbeat, KubernetesLeaseClient, Progress
from tpujob_trainer.inject import inject
from tpujob_trainer.preflight import check_devices, probe_jax

log = logging.getLogger("tpujob_trainer")


class Trainer:
    """One process's part of a training job. Not reusable: build one per run."""

    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        self.context = FailureContext(worker=config.process_id)
        self._stop_requested = threading.Event()

    def _on_sigterm(self, signum: int, _frame: FrameType | None) -> None:
        # Only async-signal-safe work here; the loop does the rest at the next step.
        self._stop_requested.set()
        os.write(2, f"tpujob-trainer: received signal {signum}, saving and stopping\n".encode())

    def _join(self) -> None:
        import jax

        # gloo makes the CPU backend's collectives real sockets between processes, so a dead
        # peer breaks the survivors' collective as it would on a TPU slice.
        jax.config.update(  # type: ignore[no-untyped-call]
            "jax_cpu_collectives_implementation", "gloo"
        )
        distributed = self.config.distributed
        if distributed is None:
            return
        timeout = self.config.collective_timeout_seconds
        log.info(
            "joining job: process %d of %d, coordinator %s, heartbeat timeout %ds",
            distributed.process_id, distributed.num_processes,
            distributed.coordinator_address, timeout,
        )
        jax.distributed.initialize(
            coordinator_address=distributed.coordinator_address,
            num_processes=distributed.num_processes,
            process_id=distributed.process_id,
            initialization_timeout=max(120, 6 * timeout),
            heartbeat_timeout_seconds=timeout,
            shutdown_timeout_seconds=timeout,
        )

    def _preflight(self) -> str:
        import jax

        probe = probe_jax(self.config.expect_tpu_chips_per_host > 0)
        log.info(
            "devices: backend=%s local=%d global=%d kinds=%s jax=%s",
            probe.backend, probe.local_devices, jax.device_count(),
            ",".join(probe.device_kinds), jax.__version__,
        )
        backend = check_devices(
            probe,
            expect_chips=self.config.expect_tpu_chips_per_host,
            allow_cpu_fallback=self.config.allow_cpu_fallback,
        )
        self.context = replace(self.context, backend=backend)
        return backend

    def _heartbeat(self) -> Heartbeat | None:
        lease = self.config.heartbeat_lease
        if lease is None or self.config.process_id != 0:
            return None
        try:
            client = KubernetesLeaseClient()
        except Exception as error:
            log.warning("heartbeat disabled: no Kubernetes credentials (%s)", error)
            return None
        heartbeat = Heartbeat(client, name=lease, namespace=self.config.namespace)
        heartbeat.start()
        return heartbeat

    def run(self) -> ExitCode:
        """Train to `config.steps`; OK, or PREEMPTED after a SIGTERM and a committed save."""
        import jax

        cfg = self.config
        self._join()
        # Installed after jax.distributed.initialize, which registers its own SIGTERM notifier.
        signal.signal(signal.SIGTERM, self._on_sigterm)
        backend = self._preflight()
        mesh = model.make_mesh()
        train_step = model.make_train_step(mesh)
        state = model.replicate(mesh, model.init_state(cfg.seed))
        checkpoints = None
        start = 0
        if cfg.checkpoint_dir:
            from tpujob_trainer.checkpointing import Checkpoints

            checkpoints = Checkpoints(cfg.checkpoint_dir, keep=cfg.keep)
            restored = checkpoints.restore(state)
            if restored is not None:
                state, start = restored.state, restored.step
                self.context = replace(self.context, checkpoint_step=start)
                if restored.skipped:
                    log.warning("checkpoint fallback: steps %s could not be restored, resumed "
                                "from %d", list(restored.skipped), start)
                log.info("resumed from step %d state_digest=%s", start, model.digest(state))
        else:
            log.warning("no checkpoint directory: progress is lost if this process stops")
        heartbeat = self._heartbeat()
        local_rows = cfg.batch_size // cfg.num_processes
        first_row = cfg.process_id * local_rows
        local_devices = len(jax.local_devices())
        window_start, window_steps, rate = time.monotonic(), 0, 0.0
        step, outcome = start, ExitCode.OK
        log.info("training steps %d..%d, global batch %d", start + 1, cfg.steps, cfg.batch_size)
        while step < cfg.steps:
            fault = due(cfg.faults, step=step + 1, worker=cfg.process_id, attempt=cfg.attempt)
            if fault is not None:
                inject(fault, step + 1, backend)
            features = IN_FEATURES + (fault is not None and fault.kind is FaultKind.SHAPE)
            batch = make_batch(cfg.seed, step + 1, cfg.batch_size, features)
            rows = slice(first_row, first_row + local_rows)
            stop_flags = np.full((local_devices,), int(self._stop_requested.is_set()), np.int32)
            state, loss, stop = train_step(
                state,
                model.shard_global(mesh, batch.x[rows], cfg.batch_size),
                model.shard_global(mesh, batch.y[rows], cfg.batch_size),
                model.shard_global(mesh, stop_flags, jax.device_count()),
            )
            loss_value = float(model.local_value(loss))
            step += 1
            self.context = replace(self.context, step=step)
            if cfg.step_time:
                time.sleep(cfg.step_time)
            window_steps += 1
            elapsed = time.monotonic() - window_start
            stopping = bool(model.local_value(stop))
            if step % cfg.log_every == 0 or step == cfg.steps or stopping:
                rate = window_steps / elapsed if elapsed > 0 else 0.0
                log.info("step %d/%d loss=%.8f steps_per_s=%.2f", step, cfg.steps, loss_value, rate)
                window_start, window_steps = time.monotonic(), 0
            due_to_save = step % cfg.checkpoint_interval == 0 or step == cfg.steps or stopping
            if checkpoints and due_to_save and checkpoints.save(step, state):
                self.context = replace(self.context, checkpoint_step=step)
                log.info("saving step %d state_digest=%s", step, model.digest(state))
            if heartbeat is not None:
                heartbeat.progress(Progress(step, cfg.steps, loss_value, rate,
                                            self.context.checkpoint_step, cfg.attempt))
            if stopping:
                outcome = ExitCode.PREEMPTED
                break
        if checkpoints:
            checkpoints.close()
            log.info("checkpoint step %s committed", self.context.checkpoint_step)
        if heartbeat is not None:
            heartbeat.stop()
        if outcome is ExitCode.OK:
            log.info("done step=%d state_digest=%s", step, model.digest(state))
        return outcome
