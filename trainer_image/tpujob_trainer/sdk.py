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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self, TypeVar

import numpy as np

from tpujob_trainer import runtime
from tpujob_trainer.collectives import gather_ints
from tpujob_trainer.config import TrainerConfig, load_loop_config
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import (
    FailureContext,
    TrainerError,
    build_message,
    report_exception,
    write_termination_message,
)
from tpujob_trainer.faults import Fault, FaultKind
from tpujob_trainer.loss_guard import LossGuard
from tpujob_trainer.step_driver import StepDriver

if TYPE_CHECKING:
    from tpujob_trainer.checkpointing import Checkpoints
    from tpujob_trainer.tiers import TieredCheckpoints

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
        self._checkpoints: Checkpoints | TieredCheckpoints | None = None
        self._driver: StepDriver | None = None

    @property
    def stopping(self) -> bool:
        """Whether the job agreed to stop after the step just done (a SIGTERM)."""
        return self._driver is not None and self._driver.stopping

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
            runtime.announce(self.config)
            self.compile_cache = runtime.join(self.config)
            # After jax.distributed.initialize, which registers its own SIGTERM notifier.
            signal.signal(signal.SIGTERM, self.on_sigterm)
            self.context = replace(self.context, backend=runtime.preflight(self.config))
            client = runtime.lease_client(self.config)
            self._checkpoints = runtime.open_checkpoints(
                self.config, runtime.save_gate(self.config, client)
            )
            self._driver = StepDriver(
                self,
                saver=self._checkpoints,
                heartbeat=runtime.heartbeat(self.config, client),
                guard=self._guard,
                read_loss=_host_float,
                health=True,
            )
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
        self.context = replace(
            self.context, step=restored.step, checkpoint_step=restored.durable_step
        )
        log.info("resumed from step %d", restored.step)
        return restored.state, restored.step

    def batches(
        self, start: int, make_batch: Callable[[int], Batch]
    ) -> Iterator[tuple[int, Batch]]:
        """`(step, batch)` from `start + 1` to the last step, until a SIGTERM stop."""
        driver = self._stepping()

        def make(index: int, fault: Fault | None) -> Batch:
            batch = make_batch(index)
            return _poisoned(batch) if fault is not None and fault.kind is FaultKind.NAN else batch

        for step in driver.steps(start):
            yield step, driver.batch(step, make)

    def step_done(self, step: int, loss: Any, state: Any) -> None:
        """Account for `step`: check the loss, heartbeat, health, save when due or stopping."""
        self._stepping().after(step, loss, state, stop=self._agreed_stop)

    def _agreed_stop(self) -> bool:
        """Whether any worker got a SIGTERM: one tiny all-gather, so all stop at this step."""
        return any(row[0] for row in gather_ints([int(self.stop_requested.is_set())]))

    def _stepping(self) -> StepDriver:
        if self._driver is None:
            raise RuntimeError("a tpujob Job steps only inside its `with` block")
        return self._driver

    def _finish(self) -> None:
        if self._driver is not None:
            self._driver.finish()

    def _fail(self, error: BaseException) -> NoReturn:
        """The failure contract: message, stderr, and an exit that skips JAX's barriers."""
        code = report_exception(error, self.context)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
