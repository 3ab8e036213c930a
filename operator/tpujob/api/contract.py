"""The failure contract between the tpujob trainer and the tpujob operator.

This module is the one source of the contract. It uses the standard library only, and
`make generate` copies it byte for byte to `operator/tpujob/api/contract.py`; a test fails when the
two drift. Both sides test against it: the trainer writes what `encode_termination_message`
produces, the operator reads it with `parse_termination_message`.

The contract has two halves:

* **Exit codes** (`ExitCode`): small numbers chosen away from the shell's 126/127 and from
  128+N (death by signal N), so a code never reads as something it is not. 42 is "preempted,
  saved, please reschedule", the retry code XPK users already know.
* **The termination message**: one JSON object, at most 4096 bytes (the kubelet's limit for
  the termination message file), written to the pod's `terminationMessagePath`.

A third, smaller part lets the healthy slices of a job stay in their pods when another slice
is replaced (a slice restart): the operator writes a **rejoin order** on each kept pod
(`POD_REJOIN_ANNOTATION`, read by the trainer from the file the pod's downward-API volume
projects it to, `ENV_REJOIN_FILE`), and the trainer's supervisor restarts its training process
in place as the order's attempt. A trainer says it can by `HEARTBEAT_REJOINS` on its heartbeat.
"""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeGuard

CONTRACT_VERSION = 1
MAX_MESSAGE_BYTES = 4096
TERMINATION_MESSAGE_PATH = "/dev/termination-log"

# Environment variables the operator sets and the trainer reads.
ENV_JOB_NAME = "TPUJOB_NAME"
ENV_NAMESPACE = "TPUJOB_NAMESPACE"
ENV_ATTEMPT = "TPUJOB_ATTEMPT"
ENV_CHECKPOINT_DIR = "TPUJOB_CHECKPOINT_DIR"
ENV_CHECKPOINT_INTERVAL = "TPUJOB_CHECKPOINT_INTERVAL_STEPS"
ENV_CHECKPOINT_KEEP = "TPUJOB_CHECKPOINT_KEEP"
ENV_HEARTBEAT_LEASE = "TPUJOB_HEARTBEAT_LEASE"
# The uid of the job object the pod belongs to: fencing tells incarnations of a name apart.
ENV_JOB_UID = "TPUJOB_JOB_UID"
ENV_ALLOW_CPU_FALLBACK = "TPUJOB_ALLOW_CPU_FALLBACK"
ENV_EXPECT_TPU_CHIPS = "TPUJOB_EXPECT_TPU_CHIPS_PER_HOST"
ENV_COLLECTIVE_TIMEOUT = "TPUJOB_COLLECTIVE_TIMEOUT_SECONDS"
# spec.framework ("jax" or "tensorflow"): which loop the reference trainer runs unless its own
# --framework flag says otherwise.
ENV_FRAMEWORK = "TPUJOB_FRAMEWORK"
ENV_FAULTS = "TPUJOB_FAULTS"
ENV_TERMINATION_MESSAGE_PATH = "TPUJOB_TERMINATION_MESSAGE_PATH"
# A rollback after a non-finite loss: restore the newest committed step at or before
# ENV_RESUME_STEP (steps after it are moved aside, not deleted), and skip data windows.
# ENV_SKIP_BATCHES is either N (skip N batches right after ENV_RESUME_STEP) or a comma-separated
# list of STEP:N windows (after step STEP, skip N batches); the operator keeps passing every
# window on later attempts so a restarted run never sees the skipped data again.
ENV_RESUME_STEP = "TPUJOB_RESUME_STEP"
ENV_SKIP_BATCHES = "TPUJOB_SKIP_BATCHES"
# How many steps between two gathers of the workers' health numbers (default 20).
ENV_HEALTH_EVERY = "TPUJOB_HEALTH_EVERY_STEPS"
# The fast local checkpoint tier (spec.checkpoint.local): a memory-backed folder of the pod,
# which outlives a training process restarted in place and dies with the pod, and how many
# steps between two saves to it (the persistent folder keeps ENV_CHECKPOINT_INTERVAL).
ENV_LOCAL_CHECKPOINT_DIR = "TPUJOB_LOCAL_CHECKPOINT_DIR"
ENV_LOCAL_CHECKPOINT_INTERVAL = "TPUJOB_LOCAL_CHECKPOINT_INTERVAL_STEPS"
# The slices the job asked for (spec.tpu.slices). An attempt of an elastic job
# (spec.elastic.minSlices) may run on fewer, MEGASCALE_NUM_SLICES of them, after a hard failure
# left no pool for the others: a trainer then keeps the job's global batch (the reference trainer
# splits it over fewer processes; one short of device memory accumulates gradients over
# ENV_PLANNED_SLICES / MEGASCALE_NUM_SLICES micro-batches). Absent on a job that is not elastic.
ENV_PLANNED_SLICES = "TPUJOB_PLANNED_SLICES"

# The file a trainer pod's rejoin order is projected to (downward API; see the module's note).
ENV_REJOIN_FILE = "TPUJOB_REJOIN_FILE"
# Set by the trainer's supervisor for the training process it runs; set in a job's own env, it
# tells the reference trainer to run without one, as its `NO_REJOIN_FLAG` does.
ENV_SUPERVISED = "TPUJOB_SUPERVISED"
NO_REJOIN_FLAG = "--no-rejoin"
# Where the supervisor keeps its state (the attempt it runs, and the code it ended with on
# purpose): a file in the pod's scratch emptyDir, which outlives the container. A supervisor
# restarted in its pod after its container was killed whole reads there what it was doing.
ENV_SUPERVISOR_STATE = "TPUJOB_SUPERVISOR_STATE_FILE"
# The container exit codes the kubelet restarts a supervised trainer's container for, in its
# pod (a container restart rule, KEP-5307): a SIGKILL, from outside or the OOM killer.
CONTAINER_RESTART_EXIT_CODES = (137,)
# The reason in the report of a supervisor restarted after its container was killed: it cannot
# tell an OOM kill from another SIGKILL (its container's cgroup counts from zero again), so the
# operator reads the kubelet's record of that end (the container's lastState: OOMKilled or Error).
CONTAINER_KILLED_REASON = "ContainerKilled"
# The env variables a rejoin order changes for the process restarted in place: the attempt and
# the coordinator (slice 0 worker 0, whose pod may be one of the replaced ones).
ENV_JAX_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_MEGASCALE_COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"

# JAX's persistent compilation cache: JAX reads its folder from this variable. For a JAX job with
# checkpoints the operator points it at `COMPILATION_CACHE_FOLDER` in the checkpoint directory,
# which every attempt of the job sees, so a restarted worker loads what an earlier attempt
# compiled instead of compiling it again. A value in the job's own env wins; an empty one turns
# the cache off.
ENV_JAX_COMPILATION_CACHE_DIR = "JAX_COMPILATION_CACHE_DIR"
COMPILATION_CACHE_FOLDER = "jax-compilation-cache"

# Annotations the trainer writes on its heartbeat Lease (renewTime is the heartbeat itself).
HEARTBEAT_STEP = "tpujob.dev/step"
HEARTBEAT_TOTAL_STEPS = "tpujob.dev/total-steps"
HEARTBEAT_LOSS = "tpujob.dev/loss"
HEARTBEAT_STEPS_PER_SECOND = "tpujob.dev/steps-per-second"
HEARTBEAT_CHECKPOINT_STEP = "tpujob.dev/checkpoint-step"
# Worker 0's newest step committed to its local tier (empty without one): newer than the
# checkpoint step, which counts the persistent tier only (what survives losing the pods).
HEARTBEAT_LOCAL_CHECKPOINT_STEP = "tpujob.dev/local-checkpoint-step"
HEARTBEAT_ATTEMPT = "tpujob.dev/attempt"
# The uid of the job whose trainer beats (`ENV_JOB_UID`). A job deleted with its pods orphaned
# and applied again under its name shares the Lease with the earlier job's trainers, which beat
# as attempt 1 too until fencing stops them; the operator counts only its own job's beats.
HEARTBEAT_JOB_UID = "tpujob.dev/job-uid"
# Health numbers, published by worker 0 with the heartbeat after each gather (empty until the
# first). Per-worker values are comma-separated, in process-id order.
HEARTBEAT_HEALTH_STEP = "tpujob.dev/health-step"
HEARTBEAT_INPUT_BOUND_FRACTION = "tpujob.dev/input-bound-fraction"
HEARTBEAT_WORKER_INPUT_BOUND = "tpujob.dev/worker-input-bound-fractions"
HEARTBEAT_WORKER_STEP_SECONDS = "tpujob.dev/worker-step-seconds"
HEARTBEAT_WORKER_RSS_BYTES = "tpujob.dev/worker-rss-bytes"

# "true" when the trainer runs under the supervisor that restarts it in place on a rejoin order.
HEARTBEAT_REJOINS = "tpujob.dev/rejoins"
# Seconds a save holds up the training loop (the mean over this attempt's saves; with
# asynchronous saves, the copy off the devices and any wait for the previous save): the cost
# the operator weighs the checkpoint interval against.
HEARTBEAT_SAVE_SECONDS = "tpujob.dev/save-seconds"

# The rejoin order on a kept trainer pod, written by the operator after the fencing token
# of the order's attempt (JSON, see `encode_rejoin`).
POD_REJOIN_ANNOTATION = "tpujob.dev/rejoin"
# The fencing token, written by the operator (never by the trainer) on the heartbeat Lease
# before it creates the pods of attempt N: the decimal attempt number N. A trainer commits a
# checkpoint only while the token equals its own attempt.
LEASE_FENCE_ANNOTATION = "tpujob.dev/fence"
# Written with the token: the uid of the job whose attempts it counts. A job deleted and applied
# again under its name gets the same Lease name and counts from attempt 1 again, so a trainer
# left over from the earlier job commits only while this names its own job.
LEASE_FENCE_JOB_ANNOTATION = "tpujob.dev/fence-job"


class ClassHint(enum.StrEnum):
    """The trainer's own view of how the failure should be treated."""

    SOFT = "soft"
    MEDIUM = "medium"
    HARD = "hard"
    FATAL = "fatal"


class ExitCode(enum.IntEnum):
    """Process exit codes of the trainer; each has a stable failure code and a class hint."""

    OK = 0
    UNKNOWN_ERROR = 1
    CONFIG_ERROR = 10
    DEVICE_FALLBACK_TO_CPU = 11
    LIBTPU_UNAVAILABLE = 12
    DEVICE_BUSY = 13
    DEVICE_COUNT_MISMATCH = 14
    USER_CODE_ERROR = 20
    SHAPE_MISMATCH = 21
    HOST_OOM = 22
    HBM_OOM = 23
    NON_FINITE_LOSS = 24
    COLLECTIVE_FAILURE = 30
    COORDINATION_TIMEOUT = 31
    CHECKPOINT_RESTORE_FAILED = 40
    CHECKPOINT_SAVE_FAILED = 41
    PREEMPTED = 42
    FENCED = 43
    # A supervisor restarted in its pod after it had itself ended with a restarted code on
    # purpose (a child's SIGKILL it passed on): it ends again at once rather than loop, and the
    # container's previous end (lastState) is the failure.
    ENDED_AFTER_KILL = 44
    DATA_ERROR = 50


@dataclass(frozen=True)
class CodeInfo:
    """What an exit code means: the failure code the operator reports and a class hint."""

    code: str
    hint: ClassHint
    summary: str


EXIT_CODES: dict[ExitCode, CodeInfo] = {
    ExitCode.UNKNOWN_ERROR: CodeInfo("UNKNOWN", ClassHint.MEDIUM, "unexpected error"),
    ExitCode.CONFIG_ERROR: CodeInfo("CONFIG_ERROR", ClassHint.FATAL, "invalid trainer config"),
    ExitCode.DEVICE_FALLBACK_TO_CPU: CodeInfo(
        "DEVICE_FALLBACK_TO_CPU", ClassHint.FATAL, "asked for TPUs but JAX fell back to CPU"
    ),
    ExitCode.LIBTPU_UNAVAILABLE: CodeInfo(
        "LIBTPU_VERSION_MISMATCH", ClassHint.FATAL, "libtpu could not be loaded"
    ),
    ExitCode.DEVICE_BUSY: CodeInfo(
        "DEVICE_BUSY", ClassHint.MEDIUM, "the TPU is held by another process"
    ),
    ExitCode.DEVICE_COUNT_MISMATCH: CodeInfo(
        "DEVICE_COUNT_MISMATCH", ClassHint.HARD, "fewer accelerator devices than requested"
    ),
    ExitCode.USER_CODE_ERROR: CodeInfo("USER_CODE_ERROR", ClassHint.FATAL, "error in user code"),
    ExitCode.SHAPE_MISMATCH: CodeInfo("SHAPE_MISMATCH", ClassHint.FATAL, "tensor shape mismatch"),
    ExitCode.HOST_OOM: CodeInfo("HOST_OOM", ClassHint.MEDIUM, "host memory exhausted"),
    ExitCode.HBM_OOM: CodeInfo("HBM_OOM", ClassHint.FATAL, "accelerator memory exhausted"),
    # Medium: a rollback to an earlier checkpoint that skips the offending data may recover.
    ExitCode.NON_FINITE_LOSS: CodeInfo(
        "NAN_LOSS", ClassHint.MEDIUM, "the loss became NaN or infinite"
    ),
    ExitCode.COLLECTIVE_FAILURE: CodeInfo(
        "COLLECTIVE_FAILURE", ClassHint.SOFT, "a collective failed: a peer went away"
    ),
    ExitCode.COORDINATION_TIMEOUT: CodeInfo(
        "COLLECTIVE_TIMEOUT", ClassHint.MEDIUM, "a collective or coordination call timed out"
    ),
    ExitCode.CHECKPOINT_RESTORE_FAILED: CodeInfo(
        "CHECKPOINT_RESTORE_FAILED", ClassHint.MEDIUM, "no checkpoint could be restored"
    ),
    ExitCode.CHECKPOINT_SAVE_FAILED: CodeInfo(
        "CHECKPOINT_SAVE_FAILED", ClassHint.MEDIUM, "a checkpoint could not be saved"
    ),
    ExitCode.PREEMPTED: CodeInfo(
        "PREEMPTED", ClassHint.SOFT, "stopped by SIGTERM after saving a checkpoint"
    ),
    # Soft: a newer attempt already trains; this one only stepped aside.
    ExitCode.FENCED: CodeInfo(
        "FENCED", ClassHint.SOFT, "a newer attempt owns the checkpoints; this attempt stopped"
    ),
    ExitCode.ENDED_AFTER_KILL: CodeInfo(
        "PROCESS_KILLED",
        ClassHint.SOFT,
        "the worker was killed (SIGKILL) and its supervisor had already ended the pod",
    ),
    ExitCode.DATA_ERROR: CodeInfo("DATA_ERROR", ClassHint.FATAL, "the input data is invalid"),
}

# A training process that ended with one of these only lost a peer (or stepped aside for a
# newer attempt): its supervisor waits a while for a rejoin order before giving up.
PEER_LOST_EXIT_CODES = frozenset(
    {ExitCode.COLLECTIVE_FAILURE, ExitCode.COORDINATION_TIMEOUT, ExitCode.FENCED}
)


@dataclass(frozen=True)
class TerminationMessage:
    """The structured termination message; field names are the JSON keys."""

    code: str
    exit_code: int
    class_hint: ClassHint
    summary: str
    step: int | None = None
    checkpoint_step: int | None = None
    backend: str | None = None
    worker: int | None = None
    traceback: str = ""
    version: int = field(default=CONTRACT_VERSION)


def encode_termination_message(message: TerminationMessage) -> str:
    """Serialise `message` as JSON of at most MAX_MESSAGE_BYTES bytes.

    The traceback is cut from its start (the tail is where the error is), then the summary,
    so the result always fits and always parses.
    """
    data: dict[str, Any] = asdict(message)
    data["class_hint"] = str(message.class_hint)
    for key in ("traceback", "summary"):
        text = json.dumps(data, separators=(",", ":"))
        excess = len(text.encode()) - MAX_MESSAGE_BYTES
        if excess <= 0:
            return text
        value: str = data[key]
        # Encoded JSON may escape characters, so cut generously and re-check.
        data[key] = (
            value[min(len(value), excess + 16) :]
            if key == "traceback"
            else value[: max(0, len(value) - excess - 16)]
        )
    text = json.dumps(data, separators=(",", ":"))
    if len(text.encode()) > MAX_MESSAGE_BYTES:
        data["traceback"], data["summary"] = "", data["summary"][:200]
        text = json.dumps(data, separators=(",", ":"))
    return text


# The largest number a status field may hold (Kubernetes' int64).
MAX_COUNT = 2**63 - 1


def parse_termination_message(text: str | None) -> TerminationMessage | None:
    """Read a termination message written by the trainer; None for anything else (free text)."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("code"), str):
        return None
    try:
        hint = ClassHint(str(data.get("class_hint", "")))
        exit_code = int(data["exit_code"])
    # json.loads reads Infinity (and 1e400) as an infinite float, which int() overflows on.
    except (KeyError, TypeError, ValueError, OverflowError):
        return None

    def optional_int(key: str) -> int | None:
        # A count the status keeps (a step, a worker index): the API's int64, never negative.
        # Anything else is absent, not a status the apiserver would refuse on every write.
        value = data.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        return value if 0 <= value <= MAX_COUNT else None

    return TerminationMessage(
        code=data["code"],
        exit_code=exit_code,
        class_hint=hint,
        summary=str(data.get("summary", "")),
        step=optional_int("step"),
        checkpoint_step=optional_int("checkpoint_step"),
        backend=data.get("backend") if isinstance(data.get("backend"), str) else None,
        worker=optional_int("worker"),
        traceback=str(data.get("traceback", "")),
        version=optional_int("version") or CONTRACT_VERSION,
    )


def describe_exit_code(exit_code: int) -> CodeInfo | None:
    """The contract's meaning of `exit_code`, or None when the trainer never uses it."""
    try:
        return EXIT_CODES.get(ExitCode(exit_code))
    except ValueError:
        return None


@dataclass(frozen=True)
class Rejoin:
    """A rejoin order: restart the training process in place as `attempt`, with its
    coordinator at `coordinator` (host only; the port stays the one the pod was given)."""

    attempt: int
    coordinator: str


MAX_REJOIN_BYTES = 512


def encode_rejoin(order: Rejoin) -> str:
    return json.dumps(
        {"attempt": order.attempt, "coordinator": order.coordinator}, separators=(",", ":")
    )


def _json_object(text: str | None, limit: int) -> dict[str, Any] | None:
    """The JSON object in `text` of at most `limit` bytes; None for anything else."""
    if not text or len(text.encode()) > limit:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def parse_rejoin(text: str | None) -> Rejoin | None:
    """The order in `text`; None for anything else (empty, free text, a bad value). Anyone who
    can patch the pod can write it, so it is bounded and checked like any untrusted input."""
    data = _json_object(text, MAX_REJOIN_BYTES)
    if data is None:
        return None
    attempt, coordinator = data.get("attempt"), data.get("coordinator")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or not 1 <= attempt <= 10**6:
        return None
    if (
        not isinstance(coordinator, str)
        or not coordinator
        or len(coordinator) > 253
        or any(ch.isspace() or ch in ":/" for ch in coordinator)
    ):
        return None
    return Rejoin(attempt=attempt, coordinator=coordinator)


# A supervised training process that ended is reported by its supervisor on the heartbeat
# Lease while the pod lives on (JSON, see `encode_failure_report`), under this prefix and
# "SLICE-WORKER": the operator diagnoses it and may restart the process in the same pod.
LEASE_FAILURE_PREFIX = "tpujob.dev/failed-"
# A lost peer's report only names its code: a slice's every host may report at once, and a
# Lease's annotations hold 256 KiB in all.
MAX_PEER_LOST_MESSAGE_BYTES = 512
MAX_FAILURE_REPORT_BYTES = MAX_MESSAGE_BYTES + 1024


@dataclass(frozen=True)
class FailureReport:
    """How one worker's training process ended, as its supervisor saw it: the fields a
    terminated container's status would show, had the pod ended."""

    attempt: int
    job_uid: str
    exit_code: int
    signal: int | None
    reason: str  # "Error", or "OOMKilled" when the container's OOM kill count rose
    message: str  # the process's termination message
    at: str  # RFC 3339, the supervisor's clock


def failure_annotation(slice_index: int, worker: int) -> str:
    return f"{LEASE_FAILURE_PREFIX}{slice_index}-{worker}"


def lost_a_peer(exit_code: int, signal: int | None = None) -> bool:
    """Whether a process that ended so only lost a peer (JAX's coordination service aborts a
    process whose peer died: SIGABRT)."""
    return exit_code in PEER_LOST_EXIT_CODES or signal == 6 or exit_code == 128 + 6


def encode_failure_report(report: FailureReport) -> str:
    """`report` as JSON of at most MAX_FAILURE_REPORT_BYTES (the message is cut to fit)."""
    data = {
        "attempt": report.attempt,
        "jobUid": report.job_uid,
        "exitCode": report.exit_code,
        "signal": report.signal,
        "reason": report.reason,
        "message": report.message,
        "at": report.at,
    }
    limit = (
        MAX_PEER_LOST_MESSAGE_BYTES
        if lost_a_peer(report.exit_code, report.signal)
        else MAX_MESSAGE_BYTES
    )
    if len(report.message.encode()) > limit:
        parsed = parse_termination_message(report.message)
        data["message"] = (
            encode_termination_message(replace(parsed, traceback="", summary=""))
            if parsed is not None
            else report.message.encode()[-limit:].decode(errors="ignore")
        )
    return json.dumps(data, separators=(",", ":"))


def parse_failure_report(text: str | None) -> FailureReport | None:
    """The report in `text`; None for anything else. Whoever may patch the Lease can write
    one, so it is bounded and checked like any untrusted input."""
    data = _json_object(text, MAX_FAILURE_REPORT_BYTES)
    if data is None:
        return None
    attempt, code, sig = data.get("attempt"), data.get("exitCode"), data.get("signal")
    job_uid, reason, message, at = (data.get(k) for k in ("jobUid", "reason", "message", "at"))
    if not (
        _small_int(attempt, 1, MAX_COUNT)
        and _small_int(code, -255, 255)
        and (sig is None or _small_int(sig, 1, 64))
        and isinstance(job_uid, str)
        and isinstance(reason, str)
        and isinstance(message, str)
        and isinstance(at, str)
    ):
        return None
    return FailureReport(attempt, job_uid, code, sig, reason[:64], message, at[:64])


def _small_int(value: object, low: int, high: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
