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
import signal
import time
from dataclasses import replace

import numpy as np

from tpujob_trainer import model, runtime
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.data import SEQUENCE_LENGTH, make_sequence_batch
from tpujob_trainer.faults import FaultKind
from tpujob_trainer.loss_guard import LossGuard, NonFiniteLossError
from tpujob_trainer.rollback import data_index

log = logging.getLogger("tpujob_trainer")


class Trainer(runtime.Loop):
    """One process's part of a training job. Not reusable: build one per run."""

    def run(self) -> ExitCode:
        """Train to `config.steps`; OK, or PREEMPTED after a SIGTERM and a committed save."""
        import jax

        cfg = self.config
        runtime.join(cfg)
        # Installed after jax.distributed.initialize, which registers its own SIGTERM notifier.
        signal.signal(signal.SIGTERM, self.on_sigterm)
        backend = runtime.preflight(cfg)
        self.context = replace(self.context, backend=backend)
        mesh = model.make_mesh()
        train_step = model.make_train_step(mesh)
        state = model.replicate(mesh, model.init_state(cfg.seed))
        start = 0
        client = runtime.lease_client(cfg)
        checkpoints = runtime.open_checkpoints(cfg, runtime.save_gate(cfg, client))
        if checkpoints is not None:
            restored = checkpoints.restore(state, resume_at=cfg.resume_step)
            if restored is not None:
                state, start = restored.state, restored.step
                self.context = replace(self.context, checkpoint_step=start)
                if restored.skipped:
                    log.warning(
                        "checkpoint fallback: steps %s could not be restored, resumed from %d",
                        list(restored.skipped),
                        start,
                    )
                log.info("resumed from step %d state_digest=%s", start, model.digest(state))
        heartbeat = runtime.heartbeat(cfg, client)
        guard = LossGuard()
        local_rows = cfg.batch_size // cfg.num_processes
        first_row = cfg.process_id * local_rows
        local_devices = len(jax.local_devices())
        step, outcome = start, ExitCode.OK
        self.begin(start)
        while step < cfg.steps:
            fault = self.fault_before(step + 1, backend)
            # The shape fault feeds sequences one token longer than the model was built for.
            length = SEQUENCE_LENGTH + (fault is not None and fault.kind is FaultKind.SHAPE)
            batch = make_sequence_batch(
                cfg.seed, data_index(step + 1, cfg.skip_windows), cfg.batch_size, length
            )
            if fault is not None and fault.kind is FaultKind.NAN:
                batch.mask[0, 0] = np.nan  # the real loss of this step becomes NaN
            rows = slice(first_row, first_row + local_rows)
            stop_flags = np.full((local_devices,), int(self.stop_requested.is_set()), np.int32)
            state, loss, stop = train_step(
                state,
                model.shard_global(mesh, batch.tokens[rows], cfg.batch_size),
                model.shard_global(mesh, batch.targets[rows], cfg.batch_size),
                model.shard_global(mesh, batch.mask[rows], cfg.batch_size),
                model.shard_global(mesh, stop_flags, jax.device_count()),
            )
            loss_value = float(model.local_value(loss))
            step += 1
            self.context = replace(self.context, step=step)
            # The loss is the same on every process (replicated), so all of them stop here
            # and may wait for the pending save: the rollback needs the last committed step.
            try:
                guard.check(step, loss_value)
            except NonFiniteLossError:
                if checkpoints:
                    committed = checkpoints.wait()
                    self.context = replace(self.context, checkpoint_step=committed)
                raise
            if cfg.step_time:
                time.sleep(cfg.step_time)
            stopping = bool(model.local_value(stop))
            self.log_progress(step, loss_value, stopping)
            due_to_save = step % cfg.checkpoint_interval == 0 or step == cfg.steps or stopping
            if checkpoints and due_to_save and checkpoints.save(step, state):
                log.info("saving step %d state_digest=%s", step, model.digest(state))
            if checkpoints:
                committed = checkpoints.committed_step()
                if committed is not None:
                    self.context = replace(self.context, checkpoint_step=committed)
            self.publish(heartbeat, step, loss_value)
            if stopping:
                outcome = ExitCode.PREEMPTED
                break
        if checkpoints:
            committed = checkpoints.close()
            if committed is not None:
                self.context = replace(self.context, checkpoint_step=committed)
            log.info("checkpoint step %s committed", self.context.checkpoint_step)
        self.stop_heartbeat(heartbeat)
        if outcome is ExitCode.OK:
            log.info("done step=%d state_digest=%s", step, model.digest(state))
        return outcome
