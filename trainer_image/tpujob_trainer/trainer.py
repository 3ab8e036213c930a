"""The JAX training run: join the job, check devices, resume, step, save, stop on SIGTERM.

`Trainer.run()` returns an exit code for the expected outcomes (OK, PREEMPTED) and raises for
everything else; `__main__` turns exceptions into the failure contract. `Trainer.context`
always says how far the run got, so a failure report carries the step and checkpoint step.

Lifecycle on SIGTERM: the handler only sets a flag. The next step carries the flag through the
step's own collective (see `model.make_train_step`), so every process learns it in the same step;
they all save that step, wait for the save to commit, and return PREEMPTED.

An attempt on fewer slices than planned (an elastic job's, after a hard failure) trains on the
same global batch, split over fewer processes; `--max-rows-per-process` makes a process short of
device memory accumulate its share in micro-batches (`model.make_train_step`).
"""

from __future__ import annotations

import logging
import signal
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np

from tpujob_trainer import model, runtime
from tpujob_trainer.config import TrainerConfig
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.data import SEQUENCE_LENGTH, SequenceBatch, make_sequence_batch
from tpujob_trainer.faults import Fault, FaultKind
from tpujob_trainer.step_driver import StepDriver

log = logging.getLogger("tpujob_trainer")


def _agreed(stop: Any) -> bool:
    """Whether the step's collective carried a SIGTERM flag from any process."""
    return bool(model.local_value(stop))


def degraded_note(cfg: TrainerConfig) -> str | None:
    """The line a degraded attempt logs at start (None at full strength): the global batch is
    kept, so each of the fewer processes takes more of it."""
    if not cfg.degraded:
        return None
    note = (
        f"training on {cfg.active_slices} of {cfg.planned_slices} slices: the global batch of "
        f"{cfg.batch_size} is kept, {cfg.rows_per_process} rows per process instead of "
        f"{cfg.batch_size // cfg.planned_processes}"
    )
    if cfg.micro_batches > 1:
        note += (
            f", in {cfg.micro_batches} micro-batches of {cfg.rows_per_process // cfg.micro_batches}"
            f" (--max-rows-per-process {cfg.max_rows_per_process})"
        )
    return note


class Trainer(runtime.Loop):
    """One process's part of a training job. Not reusable: build one per run."""

    def run(self) -> ExitCode:
        """Train to `config.steps`; OK, or PREEMPTED after a SIGTERM and a committed save."""
        import jax

        cfg = self.config
        self.compile_cache = runtime.join(cfg)
        # Installed after jax.distributed.initialize, which registers its own SIGTERM notifier.
        signal.signal(signal.SIGTERM, self.on_sigterm)
        backend = runtime.preflight(cfg)
        self.context = replace(self.context, backend=backend)
        mesh = model.make_mesh()
        train_step = model.make_train_step(mesh, cfg.micro_batches)
        state = model.replicate(mesh, model.init_state(cfg.seed))
        start = 0
        client = runtime.lease_client(cfg)
        checkpoints = runtime.open_checkpoints(cfg, runtime.save_gate(cfg, client))
        if checkpoints is not None:
            restored = checkpoints.restore(state, resume_at=cfg.resume_step)
            if restored is not None:
                state, start = restored.state, restored.step
                self.context = replace(self.context, checkpoint_step=restored.durable_step)
                if restored.skipped:
                    log.warning(
                        "checkpoint fallback: steps %s could not be restored, resumed from %d",
                        list(restored.skipped),
                        start,
                    )
                log.info("resumed from step %d state_digest=%s", start, model.digest(state))
        driver = StepDriver(
            self,
            saver=checkpoints,
            heartbeat=runtime.heartbeat(cfg, client),
            read_loss=lambda loss: float(model.local_value(loss)),
            digest=model.digest,
        )
        # The global batch is the job's whatever the process count: fewer processes (a
        # degraded attempt) take more rows each.
        local_rows = cfg.rows_per_process
        rows = slice(cfg.process_id * local_rows, (cfg.process_id + 1) * local_rows)
        local_devices = len(jax.local_devices())
        note = degraded_note(cfg)
        if note is not None:
            log.warning("%s", note)
        elif cfg.micro_batches > 1:
            log.info("%d rows per process in %d micro-batches", local_rows, cfg.micro_batches)

        def shard(local: np.ndarray) -> jax.Array:
            return model.shard_global(mesh, local, cfg.batch_size, cfg.micro_batches)

        def make_batch(index: int, fault: Fault | None) -> SequenceBatch:
            # The shape fault feeds sequences one token longer than the model was built for.
            length = SEQUENCE_LENGTH + (fault is not None and fault.kind is FaultKind.SHAPE)
            batch = make_sequence_batch(cfg.seed, index, cfg.batch_size, length)
            if fault is not None and fault.kind is FaultKind.NAN:
                batch.mask[0, 0] = np.nan  # the real loss of this step becomes NaN
            return batch

        step = start
        for step in driver.steps(start, global_batch=cfg.batch_size):
            batch = driver.batch(step, make_batch)
            # The SIGTERM flag rides in the step's own collective, so every process learns
            # it in the same step and they all stop (and save) after it.
            stop_flags = np.full((local_devices,), int(self.stop_requested.is_set()), np.int32)
            state, loss, stop = train_step(
                state,
                shard(batch.tokens[rows]),
                shard(batch.targets[rows]),
                shard(batch.mask[rows]),
                model.shard_global(mesh, stop_flags, jax.device_count()),
            )
            driver.after(step, loss, state, stop=partial(_agreed, stop))
        driver.finish()
        if driver.stopping:
            return ExitCode.PREEMPTED
        log.info("done step=%d state_digest=%s", step, model.digest(state))
        return ExitCode.OK
