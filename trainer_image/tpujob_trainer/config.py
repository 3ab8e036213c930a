"""Trainer configuration from command-line arguments and the environment the operator sets.

Pure: `load_config(argv, env)` reads nothing but its arguments, so every rule (which variable
wins, how GKE's TPU variables become a JAX process id) is tested without starting processes.
Invalid input raises `TrainerError(CONFIG_ERROR)`.

An elastic job's attempt may run on fewer slices than the job asked for (`active_slices` of
`planned_slices`, see `contract.ENV_PLANNED_SLICES`): the global batch stays the job's, so
each of the fewer processes takes more rows, in micro-batches when `--max-rows-per-process`
caps what one process holds (`micro_batches`).
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpujob_trainer.contract import (
    ENV_ALLOW_CPU_FALLBACK,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_INTERVAL,
    ENV_CHECKPOINT_KEEP,
    ENV_COLLECTIVE_TIMEOUT,
    ENV_EXPECT_TPU_CHIPS,
    ENV_FAULTS,
    ENV_FRAMEWORK,
    ENV_HEALTH_EVERY,
    ENV_HEARTBEAT_LEASE,
    ENV_JOB_UID,
    ENV_LOCAL_CHECKPOINT_DIR,
    ENV_LOCAL_CHECKPOINT_INTERVAL,
    ENV_NAMESPACE,
    ENV_PLANNED_SLICES,
    ENV_RESUME_STEP,
    ENV_SKIP_BATCHES,
    ENV_SUPERVISED,
    NO_REJOIN_FLAG,
    ExitCode,
)
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.faults import Fault, parse_faults
from tpujob_trainer.rollback import SkipWindow, parse_resume_step, parse_skip_batches

# GKE's multi-host TPU slices talk to JAX's coordinator on this port by convention.
DEFAULT_COORDINATOR_PORT = 8476
# Short on purpose: a dead peer should be noticed within tens of seconds. The operator raises
# it through ENV_COLLECTIVE_TIMEOUT when a retry is classed "medium".
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 20
# Health numbers are gathered across workers every this many steps (one tiny all-gather).
DEFAULT_HEALTH_EVERY_STEPS = 20
# GKE's multislice variable: the slices of this attempt (fewer than planned on a degraded one).
ENV_NUM_SLICES = "MEGASCALE_NUM_SLICES"


class Framework(enum.StrEnum):
    """Which training loop runs."""

    JAX = "jax"
    TENSORFLOW = "tensorflow"


@dataclass(frozen=True)
class Distributed:
    """How this process joins a multi-process JAX system."""

    coordinator_address: str
    num_processes: int
    process_id: int


@dataclass(frozen=True)
class TrainerConfig:
    """Everything one trainer process needs to know; built once at start."""

    steps: int
    batch_size: int
    seed: int
    step_time: float
    log_every: int
    checkpoint_dir: str | None
    checkpoint_interval: int
    keep: int
    faults: tuple[Fault, ...]
    framework: Framework
    distributed: Distributed | None
    collective_timeout_seconds: int
    attempt: int
    expect_tpu_chips_per_host: int
    allow_cpu_fallback: bool
    heartbeat_lease: str | None
    namespace: str
    job_uid: str | None = None
    resume_step: int | None = None
    skip_windows: tuple[SkipWindow, ...] = ()
    health_every: int = DEFAULT_HEALTH_EVERY_STEPS
    # Run by the rejoin supervisor (`tpujob_trainer.rejoin`): said on the heartbeat, so the
    # operator may keep this pod when another slice is replaced.
    rejoins: bool = False
    # The fast local checkpoint tier (`tiers`): its folder and save interval; None: no tier.
    local_checkpoint_dir: str | None = None
    local_checkpoint_interval: int = 0
    # The slices the job asked for and those this attempt runs on (fewer: degraded).
    planned_slices: int = 1
    active_slices: int = 1
    # How many rows of a step one process may hold at once (None: all of its share).
    max_rows_per_process: int | None = None

    @property
    def process_id(self) -> int:
        """This process's index in the job (0 when single-process)."""
        return self.distributed.process_id if self.distributed else 0

    @property
    def num_processes(self) -> int:
        """How many processes train together."""
        return self.distributed.num_processes if self.distributed else 1

    @property
    def rows_per_process(self) -> int:
        """This process's share of the global batch (the split `load_config` checked)."""
        return self.batch_size // self.num_processes

    @property
    def micro_batches(self) -> int:
        """How many equal micro-batches a step's rows are split into (1: no accumulation)."""
        cap = self.max_rows_per_process
        return 1 if cap is None else -(-self.rows_per_process // cap)

    @property
    def degraded(self) -> bool:
        """Whether this attempt runs on fewer slices than the job asked for."""
        return self.active_slices < self.planned_slices

    @property
    def planned_processes(self) -> int:
        """The processes of a full-strength attempt (the same hosts per slice)."""
        return self.num_processes * self.planned_slices // self.active_slices


def _int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise TrainerError(ExitCode.CONFIG_ERROR, f"{name}={value!r} is not an integer") from None


def _host_of(address: str) -> str:
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def resolve_distributed(env: Mapping[str, str]) -> Distributed | None:
    """Multi-process settings: the operator's JAX variables first, then GKE's TPU variables.

    Returns None for a single process. On GKE, process id = slice id * hosts per slice +
    worker id, and the coordinator is worker 0 of slice 0 (the megascale coordinator's host
    when there are several slices) unless JAX_COORDINATOR_ADDRESS names one.
    """
    given = env.get("JAX_COORDINATOR_ADDRESS")
    if "JAX_NUM_PROCESSES" in env or "JAX_PROCESS_ID" in env:
        num = _int(env.get("JAX_NUM_PROCESSES", "1"), "JAX_NUM_PROCESSES")
        pid = _int(env.get("JAX_PROCESS_ID", "0"), "JAX_PROCESS_ID")
        if not given:
            raise TrainerError(
                ExitCode.CONFIG_ERROR, "JAX_NUM_PROCESSES is set but JAX_COORDINATOR_ADDRESS is not"
            )
        return _checked(Distributed(given, num, pid))
    hostnames = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if not hostnames:
        return None
    worker = _int(env.get("TPU_WORKER_ID", "0"), "TPU_WORKER_ID")
    slices = _int(env.get(ENV_NUM_SLICES, "1"), ENV_NUM_SLICES)
    slice_id = _int(env.get("MEGASCALE_SLICE_ID", "0"), "MEGASCALE_SLICE_ID")
    num = len(hostnames) * slices
    if num == 1:
        return None
    if given:
        coordinator = given
    else:
        megascale = env.get("MEGASCALE_COORDINATOR_ADDRESS")
        host = _host_of(megascale) if slices > 1 and megascale else hostnames[0].strip()
        coordinator = f"{host}:{DEFAULT_COORDINATOR_PORT}"
    return _checked(Distributed(coordinator, num, slice_id * len(hostnames) + worker))


def _checked(distributed: Distributed) -> Distributed | None:
    if distributed.num_processes < 1 or not 0 <= distributed.process_id < distributed.num_processes:
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            f"process id {distributed.process_id} is outside 0..{distributed.num_processes - 1}",
        )
    return distributed if distributed.num_processes > 1 else None


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tpujob-trainer",
        description="Data-parallel JAX (or TensorFlow) training with orbax checkpoints.",
    )
    parser.add_argument("--steps", type=int, default=100, help="total training steps")
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the data")
    parser.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--log-every", type=int, default=1, help="log one line per N steps")
    parser.add_argument("--checkpoint-dir", default=env.get(ENV_CHECKPOINT_DIR) or None)
    parser.add_argument(
        "--checkpoint-interval",
        type=int,
        default=_int(env.get(ENV_CHECKPOINT_INTERVAL) or "10", ENV_CHECKPOINT_INTERVAL),
    )
    parser.add_argument(
        "--keep", type=int, default=_int(env.get(ENV_CHECKPOINT_KEEP) or "3", ENV_CHECKPOINT_KEEP)
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a real failure, e.g. crash@80, hang@120:worker=1, exit-code=3@5:attempt=0",
    )
    parser.add_argument(
        "--framework",
        choices=[f.value for f in Framework],
        # The job's spec.framework, as the operator passes it; JAX when run by hand.
        default=env.get(ENV_FRAMEWORK) or Framework.JAX.value,
    )
    parser.add_argument(
        "--max-rows-per-process",
        type=int,
        default=None,
        metavar="N",
        help="accumulate gradients when a process's rows of a step exceed N: the step runs "
        "ceil(rows / N) equal micro-batches and one optimizer update (JAX only; the "
        "TensorFlow loop ignores it)",
    )
    parser.add_argument(
        NO_REJOIN_FLAG,
        action="store_true",
        help="never restart in place: a failure of another slice replaces this pod too",
    )
    return parser


def load_config(argv: Sequence[str], env: Mapping[str, str]) -> TrainerConfig:
    """Build the config; argparse exits 2 on bad flags, everything else is CONFIG_ERROR."""
    parser = _parser(env)
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as error:
        if error.code in (0, None):
            raise
        raise TrainerError(ExitCode.CONFIG_ERROR, f"invalid arguments: {list(argv)}") from None
    try:
        faults = parse_faults([*args.fault, *env.get(ENV_FAULTS, "").split(",")])
    except ValueError as error:
        raise TrainerError(ExitCode.CONFIG_ERROR, str(error)) from error
    if args.steps < 0 or args.batch_size < 1 or args.checkpoint_interval < 1 or args.keep < 1:
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            "--steps must be >= 0 and --batch-size, --checkpoint-interval, --keep >= 1",
        )
    if args.framework not in {f.value for f in Framework}:  # from the environment
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            f"{ENV_FRAMEWORK}={args.framework!r}: not one of {[f.value for f in Framework]}",
        )
    distributed = resolve_distributed(env)
    num = distributed.num_processes if distributed else 1
    if args.batch_size % num:
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            f"--batch-size {args.batch_size} does not divide among {num} processes",
        )
    planned, active = _slices(env)
    # The TensorFlow loop trains each worker's whole batch at once: the cap is the JAX loop's.
    max_rows = args.max_rows_per_process if args.framework == Framework.JAX else None
    _check_micro_batches(args.batch_size // num, max_rows)
    timeout = _int(
        env.get(ENV_COLLECTIVE_TIMEOUT) or str(DEFAULT_COLLECTIVE_TIMEOUT_SECONDS),
        ENV_COLLECTIVE_TIMEOUT,
    )
    try:
        resume_step = parse_resume_step(env.get(ENV_RESUME_STEP))
        skip_windows = parse_skip_batches(env.get(ENV_SKIP_BATCHES), resume_step)
    except ValueError as error:
        raise TrainerError(ExitCode.CONFIG_ERROR, f"rollback settings: {error}") from None
    return TrainerConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        seed=args.seed,
        step_time=args.step_time,
        log_every=max(1, args.log_every),
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_interval=args.checkpoint_interval,
        keep=args.keep,
        faults=faults,
        framework=Framework(args.framework),
        distributed=distributed,
        collective_timeout_seconds=max(1, timeout),
        attempt=_int(env.get(ENV_ATTEMPT) or "0", ENV_ATTEMPT),
        expect_tpu_chips_per_host=_int(env.get(ENV_EXPECT_TPU_CHIPS) or "0", ENV_EXPECT_TPU_CHIPS),
        allow_cpu_fallback=(env.get(ENV_ALLOW_CPU_FALLBACK, "").lower() in {"1", "true", "yes"}),
        heartbeat_lease=env.get(ENV_HEARTBEAT_LEASE) or None,
        resume_step=resume_step,
        skip_windows=skip_windows,
        health_every=max(
            1, _int(env.get(ENV_HEALTH_EVERY) or str(DEFAULT_HEALTH_EVERY_STEPS), ENV_HEALTH_EVERY)
        ),
        namespace=env.get(ENV_NAMESPACE) or "default",
        job_uid=env.get(ENV_JOB_UID) or None,
        rejoins=env.get(ENV_SUPERVISED) == "1",
        local_checkpoint_dir=env.get(ENV_LOCAL_CHECKPOINT_DIR) or None,
        local_checkpoint_interval=_local_interval(env),
        planned_slices=planned,
        active_slices=active,
        max_rows_per_process=max_rows,
    )


def _slices(env: Mapping[str, str]) -> tuple[int, int]:
    """The slices the job asked for and those of this attempt (planned >= active >= 1)."""
    active = _int(env.get(ENV_NUM_SLICES) or "1", ENV_NUM_SLICES)
    if active < 1:
        raise TrainerError(ExitCode.CONFIG_ERROR, f"{ENV_NUM_SLICES}={active} must be >= 1")
    planned = _int(env.get(ENV_PLANNED_SLICES) or str(active), ENV_PLANNED_SLICES)
    if planned < active:
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            f"{ENV_PLANNED_SLICES}={planned} is fewer than this attempt's {active} slices "
            f"({ENV_NUM_SLICES})",
        )
    return planned, active


def _check_micro_batches(rows: int, cap: int | None) -> None:
    """A process's `rows` must split into equal micro-batches of at most `cap` rows."""
    if cap is None:
        return
    if cap < 1:
        raise TrainerError(ExitCode.CONFIG_ERROR, "--max-rows-per-process must be >= 1")
    count = -(-rows // cap)
    if rows % count:
        raise TrainerError(
            ExitCode.CONFIG_ERROR,
            f"--max-rows-per-process {cap}: this process's {rows} rows do not split into "
            f"{count} equal micro-batches; pick a cap that makes them split evenly",
        )


def _local_interval(env: Mapping[str, str]) -> int:
    """The local tier's save interval (0 without a tier); a bad value is a config error."""
    if not env.get(ENV_LOCAL_CHECKPOINT_DIR):
        return 0
    interval = _int(env.get(ENV_LOCAL_CHECKPOINT_INTERVAL) or "1", ENV_LOCAL_CHECKPOINT_INTERVAL)
    if interval < 1:
        raise TrainerError(ExitCode.CONFIG_ERROR, f"{ENV_LOCAL_CHECKPOINT_INTERVAL} must be >= 1")
    return interval


def load_loop_config(
    env: Mapping[str, str],
    *,
    steps: int,
    checkpoint_interval: int | None = None,
    log_every: int = 10,
    faults: Sequence[str] = (),
    health_every: int | None = None,
) -> TrainerConfig:
    """The config of a user's own loop (the SDK): the operator's environment, no flags.

    The batch size is the user's business there, so it is set to the process count, which
    always divides. `faults` are specs as `--fault` takes them, added to the environment's;
    they and `health_every` are the loop's own arguments because a job's spec cannot set the
    operator's `TPUJOB_` variables. An explicit `health_every` wins over the environment's,
    as an explicit `checkpoint_interval` does.
    """
    distributed = resolve_distributed(env)
    argv = [
        "--steps",
        str(steps),
        "--log-every",
        str(log_every),
        "--batch-size",
        str(distributed.num_processes if distributed else 1),
    ]
    if checkpoint_interval is not None:
        argv += ["--checkpoint-interval", str(checkpoint_interval)]
    for spec in faults:
        argv += ["--fault", spec]
    if health_every is not None:
        env = {**env, ENV_HEALTH_EVERY: str(health_every)}
    return load_config(argv, env)
