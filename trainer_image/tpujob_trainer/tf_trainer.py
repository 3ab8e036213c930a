"""The TensorFlow entry point (`--framework tensorflow`): Keras under TPUStrategy or the default.

Same data, same contract, same faults as the JAX loop. TensorFlow is an optional extra
(`tpujob-trainer[tensorflow]`) imported only here; without it the run ends with CONFIG_ERROR.
Checkpoints use `tf.train.CheckpointManager`: resume from the newest checkpoint that restores,
fall back to the previous one, save on SIGTERM and exit PREEMPTED.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from tpujob_trainer.config import TrainerConfig
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.data import IN_FEATURES, make_batch
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.faults import FaultKind, due
from tpujob_trainer.inject import inject

log = logging.getLogger("tpujob_trainer.tensorflow")

HIDDEN = 32


def _import_tensorflow() -> Any:
    try:
        import tensorflow as tf
    except ImportError as error:
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            f"--framework tensorflow needs TensorFlow, which is not importable ({error}); use "
            "an image built with the tensorflow extra (pip install 'tpujob-trainer[tensorflow]')",
        ) from error
    return tf


def _strategy(tf: Any, config: TrainerConfig) -> tuple[Any, str]:
    """TPUStrategy when a TPU answers, else the default strategy if CPU fallback is allowed."""
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        if config.expect_tpu_chips_per_host > 0 and not config.allow_cpu_fallback:
            raise TrainerError(
                ExitCode.DEVICE_FALLBACK_TO_CPU,
                f"expected {config.expect_tpu_chips_per_host} TPU chips per host but TensorFlow "
                f"found no TPU ({str(error)[:300]}); check the google.com/tpu request, the TPU "
                "device plugin and that the image's TensorFlow has TPU support",
            ) from error
        log.info("strategy: default (no TPU: %s)", str(error).splitlines()[0][:200])
        return tf.distribute.get_strategy(), "cpu"
    log.info("strategy: TPUStrategy with %d replicas", strategy.num_replicas_in_sync)
    return strategy, "tpu"


def _restore(tf: Any, checkpoint: Any, manager: Any) -> int:
    """Restore the newest checkpoint that loads, falling back to older ones; the step or 0."""
    for path in reversed(manager.checkpoints):
        try:
            checkpoint.restore(path).assert_existing_objects_matched()
        except (tf.errors.OpError, AssertionError, ValueError) as error:
            log.warning("checkpoint %s cannot be restored (%s); falling back to the previous",
                        path, str(error).splitlines()[0][:300])
            continue
        return int(checkpoint.step.numpy())
    if manager.checkpoints:
        raise TrainerError(
            ExitCode.CHECKPOINT_RESTORE_FAILED,
            f"none of the checkpoints {manager.checkpoints} could be restored",
        )
    return 0


def run_tensorflow(config: TrainerConfig) -> ExitCode:
    """Train with Keras to `config.steps`; OK, or PREEMPTED after SIGTERM and a save."""
    tf = _import_tensorflow()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    strategy, backend = _strategy(tf, config)
    with strategy.scope():
        net = tf.keras.Sequential([
            tf.keras.Input((IN_FEATURES,)),
            tf.keras.layers.Dense(HIDDEN, activation="tanh"),
            tf.keras.layers.Dense(1),
        ])
        optimizer = tf.keras.optimizers.Adam(1e-2)
        step_var = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=net, optimizer=optimizer, step=step_var)
    manager = None
    start = 0
    if config.checkpoint_dir:
        manager = tf.train.CheckpointManager(checkpoint, config.checkpoint_dir,
                                             max_to_keep=config.keep)
        start = _restore(tf, checkpoint, manager)
        if start:
            log.info("resumed from step %d", start)

    def eager_step(x: Any, y: Any) -> Any:
        def replica_step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(net(x, training=True) - y))
            grads = tape.gradient(loss, net.trainable_variables)
            optimizer.apply_gradients(zip(grads, net.trainable_variables, strict=True))
            return loss

        losses = strategy.run(replica_step, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    train_step = tf.function(eager_step)

    step, begun = start, time.monotonic()
    outcome = ExitCode.OK
    while step < config.steps:
        fault = due(config.faults, step=step + 1, worker=config.process_id, attempt=config.attempt)
        if fault is not None:
            inject(fault, step + 1, backend)
        shape_fault = fault is not None and fault.kind is FaultKind.SHAPE
        batch = make_batch(config.seed, step + 1, config.batch_size, IN_FEATURES + shape_fault)
        loss = float(train_step(tf.constant(batch.x), tf.constant(batch.y)))
        step += 1
        step_var.assign(step)
        if config.step_time:
            time.sleep(config.step_time)
        rate = (step - start) / max(time.monotonic() - begun, 1e-9)
        if step % config.log_every == 0 or step == config.steps:
            log.info("step %d/%d loss=%.8f steps_per_s=%.2f", step, config.steps, loss, rate)
        stopping = stop.is_set()
        if manager and (step % config.checkpoint_interval == 0 or step == config.steps or stopping):
            manager.save(checkpoint_number=step)
            log.info("saving step %d", step)
        if stopping:
            outcome = ExitCode.PREEMPTED
            break
    return outcome
