"""The TensorFlow entry point (`--framework tensorflow`): Keras under TPUStrategy or the default.

The same contract as the JAX loop: the device preflight's verdicts (`preflight.check_devices`),
worker 0's heartbeat on the job's Lease, the fenced save, the non-finite loss stop, the rollback
windows, the faults, the `step i/N loss=...` lines, and on SIGTERM a save of the step reached
and exit PREEMPTED. `TensorFlowTrainer.context` always says how far the run got, so a failure's
termination message carries the step and the committed checkpoint step.

The model is a small Keras MLP on the regression batches of `data.make_batch`. TensorFlow is an
optional extra (`tpujob-trainer[tensorflow]`) imported only here; without it the run ends with
CONFIG_ERROR.

Workers: on TPU, TPUStrategy spreads each step over the host's chips. Without TPUs (CPU
fallback) every worker trains its own replica on the same batches, with no collective between
workers, so worker 0 alone writes the checkpoints (`tf.train.CheckpointManager`, synchronous:
a save has committed when it returns) and every worker resumes from them. Each worker trains on
the whole global batch, so an elastic job's attempt on fewer slices keeps it as it is (and
`--max-rows-per-process`, the JAX loop's gradient accumulation, does not apply here).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

from tpujob_trainer import runtime
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.data import IN_FEATURES, Batch, make_batch
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.faults import Fault, FaultKind, restore_error_from
from tpujob_trainer.fencing import SaveGate
from tpujob_trainer.preflight import DeviceProbe, check_devices
from tpujob_trainer.restore_policy import ReadFailed, ReadFailure, RetryPolicy, read_with_retries
from tpujob_trainer.step_driver import StepDriver

log = logging.getLogger("tpujob_trainer.tensorflow")

HIDDEN = 32
LEARNING_RATE = 1e-2


def _import_tensorflow() -> Any:
    # TensorFlow's C++ start-up notices (oneDNN, CPU features) would bury the step lines the
    # operator reads from the log tail; warnings and errors still show.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        import tensorflow as tf
    except ImportError as error:
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            f"--framework tensorflow needs TensorFlow, which is not importable ({error}); use "
            "an image built with the tensorflow extra (pip install 'tpujob-trainer[tensorflow]')",
        ) from error
    return tf


def _step_of(path: str) -> int:
    """The step of a checkpoint path `.../ckpt-<step>` (saved with `checkpoint_number=step`)."""
    return int(path.rsplit("-", 1)[1])


class TensorFlowTrainer(runtime.Loop):
    """One worker's part of a TensorFlow job. Not reusable: build one per run."""

    retry = RetryPolicy()

    def _strategy(self, tf: Any) -> tuple[Any, str]:
        """TPUStrategy when a TPU answers, else the default strategy; the preflight decides."""
        cfg = self.config
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            strategy = tf.distribute.TPUStrategy(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as error:
            devices = tf.config.list_logical_devices("CPU")
            probe = DeviceProbe("cpu", len(devices), ("cpu",), str(error) or type(error).__name__)
            strategy, backend = tf.distribute.get_strategy(), "cpu"
            # The error's type only: its text (TensorFlow's "No OpKernel was registered ..."
            # for the TPU ops) is the probe's, kept for the preflight, and would read in a log
            # tail as the failure of a worker that fails later for another reason.
            log.info("strategy: default (no TPU: %s)", type(error).__name__)
        else:
            devices = tf.config.list_logical_devices("TPU")
            probe = DeviceProbe("tpu", len(devices), ("TPU",))
            backend = "tpu"
            log.info("strategy: TPUStrategy with %d replicas", strategy.num_replicas_in_sync)
        log.info(
            "devices: backend=%s local=%d kinds=%s tensorflow=%s",
            probe.backend,
            probe.local_devices,
            ",".join(probe.device_kinds),
            tf.__version__,
        )
        check_devices(
            probe,
            expect_chips=cfg.expect_tpu_chips_per_host,
            allow_cpu_fallback=cfg.allow_cpu_fallback,
            framework="TensorFlow",
        )
        return strategy, backend

    def _restore(self, tf: Any, checkpoint: Any, manager: Any) -> int:
        """Restore the newest checkpoint that loads (at or before the rollback step); 0 if none.

        The same rules as the JAX loop's (`restore_policy`): a read error that says only that
        the storage did not answer is retried with backoff, and if it persists the run ends
        with CHECKPOINT_RESTORE_FAILED, so a later attempt reads that checkpoint again instead
        of training on from an older one beside it. A checkpoint that does not load is skipped
        for the previous one; none loading while some exist is CHECKPOINT_RESTORE_FAILED.
        Nothing is deleted.
        """
        resume_at = self.config.resume_step
        paths = [p for p in manager.checkpoints if resume_at is None or _step_of(p) <= resume_at]
        read_error_from = restore_error_from(
            self.config.faults, worker=self.config.process_id, attempt=self.config.attempt
        )
        for path in reversed(paths):
            inject = read_error_from is not None and _step_of(path) >= read_error_from
            read_error_from = None if inject else read_error_from
            failure = self._read(tf, checkpoint, path, inject_error=inject)
            if failure is None:
                return int(checkpoint.step.numpy())
            detail = failure.detail
            if failure.failure is ReadFailure.TRANSIENT:
                raise TrainerError(
                    ExitCode.CHECKPOINT_RESTORE_FAILED,
                    f"checkpoint {path} could not be read after {self.retry.attempts} tries "
                    f"({detail}); nothing was deleted, a later attempt reads it again. Check "
                    "the checkpoint storage's availability",
                )
            log.warning(
                "checkpoint %s cannot be restored (%s); falling back to the previous", path, detail
            )
        if paths:
            raise TrainerError(
                ExitCode.CHECKPOINT_RESTORE_FAILED,
                f"none of the checkpoints {paths} could be restored; nothing was deleted",
            )
        return 0

    def _read(
        self, tf: Any, checkpoint: Any, path: str, *, inject_error: bool
    ) -> ReadFailed | None:
        """Restore `path`, retrying transient errors; None once loaded, else why not."""

        def load() -> None:
            nonlocal inject_error
            if inject_error:
                inject_error = False
                raise OSError(errno.EIO, f"injected transient read error on {path}")
            checkpoint.restore(path).assert_existing_objects_matched()

        outcome = read_with_retries(
            load,
            self.retry,
            what=f"checkpoint {path}",
            errors=(tf.errors.OpError, AssertionError, ValueError, OSError),
        )
        return outcome if isinstance(outcome, ReadFailed) else None

    def run(self) -> ExitCode:
        """Train with Keras to `config.steps`; OK, or PREEMPTED after SIGTERM and a save."""
        cfg = self.config
        tf = _import_tensorflow()
        signal.signal(signal.SIGTERM, self.on_sigterm)
        strategy, backend = self._strategy(tf)
        self.context = replace(self.context, backend=backend)
        with strategy.scope():
            net = tf.keras.Sequential(
                [
                    tf.keras.Input((IN_FEATURES,)),
                    tf.keras.layers.Dense(HIDDEN, activation="tanh"),
                    tf.keras.layers.Dense(1),
                ]
            )
            optimizer = tf.keras.optimizers.Adam(LEARNING_RATE)
            step_var = tf.Variable(0, dtype=tf.int64)
        checkpoint = tf.train.Checkpoint(model=net, optimizer=optimizer, step=step_var)
        client = runtime.lease_client(cfg)
        # Only worker 0 saves (see the module docstring), so its own fencing verdict is the
        # job's: the gate's default agreement is with itself alone, no collective.
        gate = None
        if cfg.heartbeat_lease is not None and client is not None:
            gate = SaveGate(
                client,
                lease=cfg.heartbeat_lease,
                namespace=cfg.namespace,
                attempt=cfg.attempt,
                job_uid=cfg.job_uid,
            )
        manager, start = None, 0
        if cfg.checkpoint_dir:
            # gs:// goes to TensorFlow's own Cloud Storage file system, which needs no directory.
            if "://" not in cfg.checkpoint_dir:
                Path(cfg.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            manager = tf.train.CheckpointManager(
                checkpoint, cfg.checkpoint_dir, max_to_keep=cfg.keep
            )
            start = self._restore(tf, checkpoint, manager)
            if start:
                self.context = replace(self.context, step=start, checkpoint_step=start)
                log.info("resumed from step %d", start)
        else:
            log.warning("no checkpoint directory: progress is lost if this process stops")
        driver = StepDriver(
            self,
            # Only worker 0 saves (see the module docstring).
            saver=(
                _KerasCheckpoints(manager, gate)
                if manager is not None and cfg.process_id == 0
                else None
            ),
            heartbeat=runtime.heartbeat(cfg, client),
        )

        def replica_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(net(x, training=True) - y))
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))
            return loss

        def eager_step(x: Any, y: Any) -> Any:
            losses = strategy.run(replica_step, args=(x, y))
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

        train_step = tf.function(eager_step)

        def make(index: int, fault: Fault | None) -> Batch:
            features = IN_FEATURES + (fault is not None and fault.kind is FaultKind.SHAPE)
            batch = make_batch(cfg.seed, index, cfg.batch_size, features)
            if fault is not None and fault.kind is FaultKind.NAN:
                batch.x[0, 0] = float("nan")  # the real loss of this step becomes NaN
            return batch

        if cfg.degraded:
            log.warning(
                "training on %d of %d slices: the global batch of %d is kept, every worker "
                "trains on all of it as at full strength",
                cfg.active_slices,
                cfg.planned_slices,
                cfg.batch_size,
            )
        for step in driver.steps(start, global_batch=cfg.batch_size):
            batch = driver.batch(step, make)
            loss = train_step(tf.constant(batch.x), tf.constant(batch.y))
            step_var.assign(step)
            # No collective between workers (see the module docstring): each stops on its own.
            driver.after(step, loss, checkpoint, stop=self.stop_requested.is_set)
        driver.finish()
        return ExitCode.PREEMPTED if driver.stopping else ExitCode.OK


class _KerasCheckpoints:
    """Worker 0's `tf.train.CheckpointManager` as the step driver's saver, fenced by `gate`.

    Saves are synchronous (a save has committed when it returns), so waiting is immediate.
    The state saved is the one the manager's `tf.train.Checkpoint` tracks.
    """

    def __init__(self, manager: Any, gate: SaveGate | None) -> None:
        self._manager = manager
        self._gate = gate
        self._committed: int | None = None

    def save(self, step: int, state: Any) -> bool:
        """Save `step` when fencing allows (the gate agrees with this worker alone)."""
        if self._gate is not None and not self._gate.authorize(step):
            return False
        self._manager.save(checkpoint_number=step)
        self._committed = step
        return True

    def committed_step(self) -> int | None:
        """The step last saved in this run (None before any)."""
        return self._committed

    def wait(self) -> int | None:
        """The step last saved: nothing is pending."""
        return self._committed

    def close(self) -> int | None:
        """The step last saved; the manager holds no threads to release."""
        return self._committed
