"""The step driver: what happens around every training step, decided once for every loop.

The reference JAX trainer (`trainer`), the TensorFlow entry (`tf_trainer`) and the SDK
(`sdk.Job`) each run a step their own way and save their state their own way (a `Saver`);
everything around the step is here, in this order:

* `steps(start)`: logs the steps about to be trained, starts the rate window, and yields the
  steps up to `--steps` until the job agreed to stop.
* `batch(step, make)`: makes the one-shot fault due before the step happen (the shape and NaN
  faults are handed to `make`, which applies them to the loop's own batch), then times
  `make(data_index, fault)` as the step's data wait; the data index skips the rollback windows.
* `after(step, loss, state, stop=...)`: reads the loss and times the step; checks it (a NaN,
  an infinity, a spike); on a bad loss waits for the pending save, so the failure names the
  last committed step. Then the demo's `--step-time`, the job's decision to stop, the progress
  line, the save (on the interval, at the last step, and on a stop, which waits for it to
  commit), the committed step, and the heartbeat.
* `finish()`: the last save committed, and the heartbeat's last renewal naming it.

With `health` (the SDK's loops) it also applies the lasting faults that drill the health
signals (`slow-input`, `straggle`, `leak`) and gathers the workers' health every
`health_every` steps for worker 0's heartbeat.

Each loop keeps how its workers agree to stop (`stop`): the JAX step carries the SIGTERM flag
in its own collective, the SDK gathers it, and TensorFlow workers, which share no collective,
stop on their own flag. `after` and `finish` are collectives whenever the saver, `stop` or the
health gather is: call them on every worker at the same step. The driver keeps the loop's
`context` up to date (the step and the committed checkpoint step), so a failure at any point
reports how far the run got. Build one per run, after the checkpoints and the heartbeat opened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np

from tpujob_trainer.collectives import gather_floats
from tpujob_trainer.faults import (
    LEAK_BYTES,
    SLOW_INPUT_SECONDS,
    STRAGGLE_SECONDS,
    Fault,
    FaultKind,
    due,
    lasting,
)
from tpujob_trainer.health import Health, StepTiming, StepWindow, from_rows, rss_bytes
from tpujob_trainer.heartbeat import Progress
from tpujob_trainer.inject import inject
from tpujob_trainer.loss_guard import LossGuard, NonFiniteLossError
from tpujob_trainer.rollback import data_index
from tpujob_trainer.runtime import Loop

log = logging.getLogger("tpujob_trainer")

State = Any
Batch = TypeVar("Batch")


class Saver(Protocol):
    """How a loop saves its state: orbax `Checkpoints`, or TensorFlow's checkpoint manager.

    Saves may be asynchronous; `committed_step` says which one finished. Fencing is the
    saver's own: `save` returns False when the Lease forbids this save and raises
    `FencedError` when a newer attempt owns the checkpoints.
    """

    def save(self, step: int, state: State) -> bool:
        """Start saving `state` as `step`; False when nothing was saved."""
        ...

    def committed_step(self) -> int | None:
        """The newest step whose save has committed (None before any)."""
        ...

    def wait(self) -> int | None:
        """Block until every started save has committed; the committed step."""
        ...

    def close(self) -> int | None:
        """Wait for the pending saves and release the saver; the committed step."""
        ...


@runtime_checkable
class LocalSaver(Protocol):
    """A saver with a fast local tier too (`tiers.TieredCheckpoints`)."""

    def save_local(self, step: int, state: State) -> bool:
        """Start saving `state` as `step` to the local tier only; False when not saved."""
        ...

    def local_committed_step(self) -> int | None:
        """This process's newest step committed to the local tier."""
        ...


class ProgressSink(Protocol):
    """Where each step's numbers go: worker 0's heartbeat on the job's Lease."""

    def progress(self, progress: Progress) -> None:
        """Take the numbers of the step just done."""
        ...

    def stop(self) -> None:
        """Publish the last numbers and stop."""
        ...


class StepDriver:
    """Runs what happens around the steps of one run of `loop` (see the module docstring)."""

    def __init__(
        self,
        loop: Loop,
        *,
        saver: Saver | None,
        heartbeat: ProgressSink | None,
        guard: LossGuard | None = None,
        read_loss: Callable[[Any], float] = float,
        digest: Callable[[State], str] | None = None,
        health: bool = False,
        gather: Callable[[Sequence[float]], list[list[float]]] = gather_floats,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """`read_loss` turns the loss a step returned into a host float (blocking on the device
        until the step finished); `digest` describes a saved state in the save's log line."""
        self._loop = loop
        self._config = loop.config
        self._saver = saver
        self._heartbeat = heartbeat
        self._guard = guard or LossGuard()
        self._read_loss = read_loss
        self._digest = digest
        self._health_on = health
        self._gather = gather
        self._clock = clock
        self._sleep = sleep
        self.stopping = False
        self._rate = 0.0
        self._rate_window = (clock(), 0)
        self._window = StepWindow()
        self._health: Health | None = None
        self._leaked: list[np.ndarray] = []
        self._published: Progress | None = None
        self._step_started = clock()
        self._data_wait = 0.0
        self._saves = (0, 0.0)  # saves started in this run, seconds they held the loop up

    def steps(self, start: int, *, global_batch: int | None = None) -> Iterator[int]:
        """The steps after `start` up to `--steps`; none after the job agreed to stop."""
        cfg = self._config
        batch = f", global batch {global_batch}" if global_batch is not None else ""
        log.info("training steps %d..%d%s", start + 1, cfg.steps, batch)
        self._rate_window = (self._clock(), 0)
        for step in range(start + 1, cfg.steps + 1):
            if self.stopping:
                return
            yield step

    def batch(self, step: int, make: Callable[[int, Fault | None], Batch]) -> Batch:
        """The batch of `step`: `make(data_index, fault)`, after the fault due was made to happen.

        `fault` is the one-shot fault of this step, if any; `make` applies a shape or NaN fault
        to its own batch (every other kind has happened already, or never returns).
        """
        cfg = self._config
        fault = due(cfg.faults, step=step, worker=cfg.process_id, attempt=cfg.attempt)
        if fault is not None:
            inject(fault, step, self._loop.context.backend or "cpu")
        self._step_started = self._clock()
        if self._health_on and self._lasting(FaultKind.SLOW_INPUT, step):
            self._sleep(SLOW_INPUT_SECONDS)
        made = make(data_index(step, cfg.skip_windows), fault)
        self._data_wait = self._clock() - self._step_started
        return made

    def after(self, step: int, loss: Any, state: State, *, stop: Callable[[], bool]) -> None:
        """Account for `step`, whose loss and new state the loop just got.

        `loss` as the step returned it (see `read_loss`). `stop` is asked once the loss passed
        its check: whether the job stops after this step (a SIGTERM reached a worker).
        Raises `NonFiniteLossError` for a bad loss, and what the saver raises.
        """
        cfg = self._config
        if self._health_on and self._lasting(FaultKind.STRAGGLE, step):
            self._sleep(STRAGGLE_SECONDS)
        if self._health_on and self._lasting(FaultKind.LEAK, step):
            self._leaked.append(np.ones(LEAK_BYTES, np.uint8))  # written, so really resident
        host_done = self._clock()
        loss_value = self._read_loss(loss)  # blocks until the device finished the step
        if self._loop.compile_cache is not None:
            # Once, after the step that compiled (or loaded) the training step.
            log.info("%s", self._loop.compile_cache.summary())
            self._loop.compile_cache = None
        now = self._clock()
        wall = now - self._step_started
        host = max(0.0, wall - (now - host_done) - self._data_wait)
        self._window.record(StepTiming(self._data_wait, host, wall))
        self._loop.context = replace(self._loop.context, step=step)
        try:
            self._guard.check(step, loss_value)
        except NonFiniteLossError:
            # Every worker sees the same (replicated) loss and stops here, so waiting for the
            # pending save is safe; the rollback needs the newest committed step before it.
            if self._saver is not None:
                self._note_committed(self._saver.wait())
            raise
        if cfg.step_time:
            self._sleep(cfg.step_time)
        self.stopping = stop()
        if self._health_on and step % cfg.health_every == 0:
            self._gather_health(step)
        self._log_progress(step, loss_value)
        self._save_if_due(step, state)
        self._publish(step, loss_value)

    def finish(self) -> None:
        """Wait for the last save to commit and stop the heartbeat, which then names it."""
        if self._saver is not None:
            self._note_committed(self._saver.close())
            log.info("checkpoint step %s committed", self._loop.context.checkpoint_step)
        if self._heartbeat is None:
            return
        # The last save commits after the last step was published (saves are asynchronous),
        # so without this the job's status would name the checkpoint before it.
        last, committed = self._published, self._loop.context.checkpoint_step
        if last is not None and last.checkpoint_step != committed:
            self._heartbeat.progress(replace(last, checkpoint_step=committed))
        self._heartbeat.stop()

    def _lasting(self, kind: FaultKind, step: int) -> bool:
        cfg = self._config
        return lasting(cfg.faults, kind, step=step, worker=cfg.process_id, attempt=cfg.attempt)

    def _gather_health(self, step: int) -> None:
        """One row per worker (a collective); worker 0 logs and later publishes the result."""
        self._health = from_rows(step, self._gather(self._window.row(rss_bytes())))
        if self._config.process_id == 0:
            log.info(
                "health step=%d input_bound=%.3f worker_step_s=%s rss_mib=%s",
                step,
                self._health.input_bound_fraction,
                ",".join(f"{v:.3f}" for v in self._health.worker_step_seconds),
                ",".join(str(v >> 20) for v in self._health.worker_rss_bytes),
            )

    def _log_progress(self, step: int, loss: float) -> None:
        """Count `step`; every `log_every` steps, at the end and on a stop, log the progress line
        the operator reads from the log tail and update the rate (steps per second)."""
        cfg = self._config
        started, steps = self._rate_window
        steps += 1
        if step % cfg.log_every == 0 or step == cfg.steps or self.stopping:
            elapsed = self._clock() - started
            self._rate = steps / elapsed if elapsed > 0 else 0.0
            log.info("step %d/%d loss=%.8f steps_per_s=%.2f", step, cfg.steps, loss, self._rate)
            started, steps = self._clock(), 0
        self._rate_window = (started, steps)

    def _save_if_due(self, step: int, state: State) -> None:
        """Save on the interval, at the last step and on a stop (to every tier), and to the
        local tier alone on its own interval; note what has committed."""
        cfg = self._config
        if self._saver is None:
            return
        local = self._saver if isinstance(self._saver, LocalSaver) else None
        persistent_due = step % cfg.checkpoint_interval == 0 or step == cfg.steps or self.stopping
        if (
            local is not None
            and not persistent_due
            and cfg.local_checkpoint_interval
            and step % cfg.local_checkpoint_interval == 0
        ):
            # Not counted in the save cost the heartbeat reports: that one prices the
            # persistent interval, which the operator's cadence advice is about.
            local.save_local(step, state)
        if persistent_due:
            began = self._clock()
            saved = self._saver.save(step, state)
            if saved:
                count, seconds = self._saves
                self._saves = (count + 1, seconds + self._clock() - began)
                described = f" state_digest={self._digest(state)}" if self._digest else ""
                log.info("saving step %d%s", step, described)
            if self.stopping:
                # The job stops after this step: the heartbeat's last renewal names this save.
                self._saver.wait()
        self._note_committed(self._saver.committed_step())

    def _note_committed(self, step: int | None) -> None:
        if step is not None:
            self._loop.context = replace(self._loop.context, checkpoint_step=step)

    def _publish(self, step: int, loss: float) -> None:
        """Hand `step`'s numbers to the heartbeat (worker 0's; None elsewhere)."""
        if self._heartbeat is None:
            return
        cfg = self._config
        self._published = Progress(
            step,
            cfg.steps,
            loss,
            self._rate,
            self._loop.context.checkpoint_step,
            cfg.attempt,
            self._health,
            rejoins=cfg.rejoins,
            save_seconds=self._saves[1] / self._saves[0] if self._saves[0] else None,
            local_checkpoint_step=(
                self._saver.local_committed_step() if isinstance(self._saver, LocalSaver) else None
            ),
        )
        self._heartbeat.progress(self._published)
