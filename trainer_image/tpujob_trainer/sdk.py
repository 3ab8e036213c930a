"""The SDK: tpujob's contract for any JAX training loop, in a few lines.

    with sdk.Job.from_env(steps=1000) as job:          # join, preflight, SIGTERM, heartbeat
        state, start = job.restore(init_state())       # newest good checkpoint (or a rollback)
        for step, batch in job.batches(start, make_batch):   # data wait timed, faults applied
            state, loss = train_step(state, batch)
            job.step_done(step, loss, state)           # loss check, heartbeat, health, saves

What each part gives:

* `__enter__`: joins the job's JAX processes (the operator's env), checks the devices
  (preflight), installs the SIGTERM flag, starts worker 0's heartbeat, opens the checkpoints
  (fenced by the Lease token when the operator runs the job).
* `batches`: yields `(step, batch)` to `--steps`; `make_batch(index)` is called with the data
  index, which skips the windows of a rollback. Time spent in it is the step's data wait.
* `step_done`: pass the loss *as returned by the step* (not yet converted to a float), so the
  SDK can tell host time from time blocked on the device. It checks the loss (NaN, inf,
  optional spike), agrees on the SIGTERM stop with the other workers (one tiny all-gather per
  step), saves on the interval, at the end and on SIGTERM, gathers health every
  `TPUJOB_HEALTH_EVERY_STEPS` steps and hands the numbers to the heartbeat.
* `__exit__`: after a SIGTERM save, writes the PREEMPTED termination message and exits 42;
  on any exception, writes the failure contract's message and exits with its code.

Every method that touches other processes is a collective: call it on every worker at the same
step, as a data-parallel loop naturally does.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any, NoReturn, Self, TypeVar

import numpy as np

from tpujob_trainer import runtime
from tpujob_trainer.collectives import gather_floats, gather_ints
from tpujob_trainer.config import TrainerConfig, load_loop_config
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import (
    FailureContext,
    TrainerError,
    build_message,
    report_exception,
    write_termination_message,
)
from tpujob_trainer.faults import (
    LEAK_BYTES,
    SLOW_INPUT_SECONDS,
    STRAGGLE_SECONDS,
    FaultKind,
    due,
    lasting,
)
from tpujob_trainer.health import Health, StepTiming, StepWindow, from_rows, rss_bytes
from tpujob_trainer.inject import inject
from tpujob_trainer.loss_guard import LossGuard, NonFiniteLossError
from tpujob_trainer.rollback import data_index

log = logging.getLogger("tpujob_trainer.sdk")

Batch = TypeVar("Batch")


def setup_logging() -> None:
    """The trainer's log format on stdout, tpujob's progress lines at INFO.

    Optional: the operator reads `step i/N loss=...` lines from the log tail when there is no
    heartbeat, so a loop that configures logging itself should keep `tpujob_trainer` at INFO.
    """
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("tpujob_trainer").setLevel(logging.INFO)


def _poisoned(batch: Any) -> Any:
    """The batch with NaN in every float array: the real loss of the step becomes NaN."""
    import jax

    def poison(leaf: Any) -> Any:
        # Elementwise on a jax.Array keeps its sharding, even across processes.
        floating = np.issubdtype(getattr(leaf, "dtype", np.dtype(object)), np.floating)
        return leaf * np.nan if floating else leaf

    return jax.tree.map(poison, batch)


def _host_float(value: Any) -> float:
    """A scalar on the host; a replicated multi-process array is read from a local shard."""
    shards = getattr(value, "addressable_shards", None)
    return float(np.asarray(shards[0].data if shards else value))


class Job(runtime.Loop):
    """One process's part of a job run by the tpujob operator; a context manager."""

    def __init__(self, config: TrainerConfig, *, guard: LossGuard | None = None) -> None:
        super().__init__(config)
        self._guard = guard or LossGuard()
        self._window = StepWindow()
        self._leaked: list[np.ndarray] = []
        self._checkpoints: Any = None
        self._heartbeat: Any = None
        self._health: Health | None = None
        self._step_started = 0.0
        self._data_wait = 0.0
        self.stopping = False

    @classmethod
    def from_env(
        cls,
        *,
        steps: int,
        checkpoint_interval: int | None = None,
        log_every: int = 10,
        spike_factor: float | None = None,
        faults: Sequence[str] = (),
        health_every: int | None = None,
    ) -> Self:
        """A job configured by the operator's environment (see `contract` for the names).

        `faults` (fault specs, as the reference trainer's `--fault`) and `health_every` come
        from the loop's own command line when it has one for them; see `load_loop_config`.
        """
        try:
            config = load_loop_config(
                os.environ,
                steps=steps,
                checkpoint_interval=checkpoint_interval,
                log_every=log_every,
                faults=faults,
                health_every=health_every,
            )
        except TrainerError as error:
            # Before any process joined: the contract's message and code, as a bad flag of the
            # reference trainer gives.
            code = report_exception(error, FailureContext())
            sys.exit(int(code))
        return cls(config, guard=LossGuard(spike_factor=spike_factor))

    def __enter__(self) -> Self:
        try:
            runtime.join(self.config)
            # After jax.distributed.initialize, which registers its own SIGTERM notifier.
            signal.signal(signal.SIGTERM, self.on_sigterm)
            self.context = replace(self.context, backend=runtime.preflight(self.config))
            client = runtime.lease_client(self.config)
            self._checkpoints = runtime.open_checkpoints(
                self.config, runtime.save_gate(self.config, client)
            )
            self._heartbeat = runtime.heartbeat(self.config, client)
        except BaseException as error:
            self._fail(error)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        _trace: TracebackType | None,
    ) -> None:
        if error is not None and not isinstance(error, SystemExit):
            self._fail(error)
        try:
            self._finish()
        except BaseException as failure:
            self._fail(failure)
        if self.stopping:
            saved = self.context.checkpoint_step
            summary = (
                f"stopped by SIGTERM after saving step {saved}"
                if saved is not None
                else "stopped by SIGTERM; no checkpoint was saved"
            )
            write_termination_message(build_message(ExitCode.PREEMPTED, summary, self.context))
            sys.exit(int(ExitCode.PREEMPTED))

    def restore(self, state: Any) -> tuple[Any, int]:
        """The newest good checkpoint's state and step, or `(state, 0)` when there is none.

        `state` is the template (shapes, dtypes, shardings) and the fresh start.
        """
        if self._checkpoints is None:
            return state, 0
        restored = self._checkpoints.restore(state, resume_at=self.config.resume_step)
        if restored is None:
            return state, 0
        if restored.skipped:
            log.warning(
                "checkpoint fallback: steps %s could not be restored, resumed from %d",
                list(restored.skipped),
                restored.step,
            )
        self.context = replace(self.context, step=restored.step, checkpoint_step=restored.step)
        log.info("resumed from step %d", restored.step)
        return restored.state, restored.step

    def batches(
        self, start: int, make_batch: Callable[[int], Batch]
    ) -> Iterator[tuple[int, Batch]]:
        """`(step, batch)` from `start + 1` to the last step, until a SIGTERM stop."""
        cfg = self.config
        for step in range(start + 1, cfg.steps + 1):
            if self.stopping:
                return
            fault = due(cfg.faults, step=step, worker=cfg.process_id, attempt=cfg.attempt)
            if fault is not None and fault.kind is not FaultKind.NAN:
                inject(fault, step, self.context.backend or "cpu")
            self._step_started = time.monotonic()
            if lasting(
                cfg.faults,
                FaultKind.SLOW_INPUT,
                step=step,
                worker=cfg.process_id,
                attempt=cfg.attempt,
            ):
                time.sleep(SLOW_INPUT_SECONDS)
            batch = make_batch(data_index(step, cfg.skip_windows))
            if fault is not None and fault.kind is FaultKind.NAN:
                batch = _poisoned(batch)
            self._data_wait = time.monotonic() - self._step_started
            yield step, batch

    def step_done(self, step: int, loss: Any, state: Any) -> None:
        """Account for `step`: check the loss, heartbeat, health, save when due or stopping."""
        cfg = self.config
        on = {"step": step, "worker": cfg.process_id, "attempt": cfg.attempt}
        if lasting(cfg.faults, FaultKind.STRAGGLE, **on):
            time.sleep(STRAGGLE_SECONDS)
        if lasting(cfg.faults, FaultKind.LEAK, **on):
            self._leaked.append(np.ones(LEAK_BYTES, np.uint8))  # written, so really resident
        host_done = time.monotonic()
        loss_value = _host_float(loss)  # blocks until the device finished the step
        now = time.monotonic()
        wall = now - self._step_started
        host = max(0.0, wall - (now - host_done) - self._data_wait)
        self._window.record(StepTiming(self._data_wait, host, wall))
        self.context = replace(self.context, step=step)
        try:
            self._guard.check(step, loss_value)
        except NonFiniteLossError:
            # Every worker sees the same (replicated) loss and stops here, so waiting for the
            # pending save is safe; the rollback needs the newest committed step before the NaN.
            self._settle_checkpoints()
            raise
        self.stopping = any(row[0] for row in gather_ints([int(self.stop_requested.is_set())]))
        if step % cfg.health_every == 0:
            rows = gather_floats(self._window.row(rss_bytes()))
            self._health = from_rows(step, rows)
            if cfg.process_id == 0:
                log.info(
                    "health step=%d input_bound=%.3f worker_step_s=%s rss_mib=%s",
                    step,
                    self._health.input_bound_fraction,
                    ",".join(f"{v:.3f}" for v in self._health.worker_step_seconds),
                    ",".join(str(v >> 20) for v in self._health.worker_rss_bytes),
                )
        self.log_progress(step, loss_value, self.stopping)
        due_to_save = step % cfg.checkpoint_interval == 0 or step == cfg.steps or self.stopping
        if self._checkpoints is not None and due_to_save:
            if self._checkpoints.save(step, state):
                log.info("saving step %d", step)
            if self.stopping:
                self._checkpoints.wait()
        if self._checkpoints is not None:
            committed = self._checkpoints.committed_step()
            if committed is not None:
                self.context = replace(self.context, checkpoint_step=committed)
        self.publish(self._heartbeat, step, loss_value, self._health)

    def _settle_checkpoints(self) -> None:
        if self._checkpoints is not None:
            committed = self._checkpoints.wait()
            if committed is not None:
                self.context = replace(self.context, checkpoint_step=committed)

    def _finish(self) -> None:
        if self._checkpoints is not None:
            committed = self._checkpoints.close()
            if committed is not None:
                self.context = replace(self.context, checkpoint_step=committed)
            log.info("checkpoint step %s committed", self.context.checkpoint_step)
        self.stop_heartbeat(self._heartbeat)

    def _fail(self, error: BaseException) -> NoReturn:
        """The failure contract: message, stderr, and an exit that skips JAX's barriers."""
        code = report_exception(error, self.context)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
