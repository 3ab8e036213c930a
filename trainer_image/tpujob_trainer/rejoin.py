"""The supervisor that lets a trainer pod rejoin its job in place after a slice restart.

When one slice of a multislice job fails, the operator replaces only that slice's pods; the
healthy slices' pods stay, but their training processes must start again as the new attempt
(JAX's distributed runtime does not take a new peer into a running job). So the pod's main
process is this supervisor: it runs the training process as its child and watches the pod's
rejoin order (`contract.ENV_REJOIN_FILE`, which the kubelet keeps equal to the pod's
`contract.POD_REJOIN_ANNOTATION`). An order for a newer attempt kills the child and starts it
again with that attempt and coordinator. The operator writes the order only after it has
fenced the checkpoints to that attempt, so the killed child can no longer commit.

A child that failed is reported on the job's heartbeat Lease (`tpujob_trainer.failure_report`)
and the pod is held for `REPORTED_HOLD_SECONDS`: the operator diagnoses the report as it would
the pod's end and, for a transient failure on a healthy node, orders the process restarted
here, with no new pod. Where no report can be written, a child that only lost a peer
(`contract.lost_a_peer`) is held for `hold_seconds` (the operator is deciding whether this pod
is kept), and every other end is the pod's own end at once, so the operator sees a root failure
as soon as it happens. A hold that no order ends is the pod's end, with the child's code.
SIGTERM goes to the child (which saves and stops) and ends the supervisor with the child's
code. Every trainer pod gets the order file: a multislice job's healthy slices rejoin when
another is replaced, and after a hang or a reported failure every pod of a job may get an
order, so its processes restart in the pods they ran in.

A container killed whole (the supervisor with its child: a SIGKILL from outside, or an OOM kill
on a cgroup v2 node, which kills a container's processes together) is restarted in its pod by
the kubelet's container restart rule (exit 137, `contract.CONTAINER_RESTART_EXIT_CODES`). The
supervisor keeps a state file in the pod's scratch emptyDir (`tpujob_trainer.supervisor_state`):
the attempt it runs, and the code it ends with on purpose. A supervisor that finds an attempt
with no end was killed: it reports the kill on the Lease for that attempt (exit 137, SIGKILL, as
a killed training process is reported, so the operator grades it the same; its reason,
`contract.CONTAINER_KILLED_REASON`, sends the operator to the kubelet's record of the kill,
which alone tells an OOM kill) and holds for an
order exactly as after a failed child, then runs the new attempt; with no report or no order it
ends with `ExitCode.ENDED_AFTER_KILL`. One that finds an end of its own was started again
although it meant to end: the end it propagated was a restarted code (a child's SIGKILL passed
on), so it ends at once, again, with `ExitCode.ENDED_AFTER_KILL` rather than loop, and the
operator reads the container's previous end (its lastState) as the failure. An end of another
code (killed between deciding and leaving) is made again.

Standard library only (a report loads the kubernetes client when it is sent): it runs before,
and around, everything JAX.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from tpujob_trainer.contract import (
    CONTAINER_KILLED_REASON,
    CONTAINER_RESTART_EXIT_CODES,
    ENV_ATTEMPT,
    ENV_JAX_COORDINATOR,
    ENV_MEGASCALE_COORDINATOR,
    ENV_REJOIN_FILE,
    ENV_SUPERVISED,
    ENV_SUPERVISOR_STATE,
    ENV_TERMINATION_MESSAGE_PATH,
    MAX_REJOIN_BYTES,
    PEER_LOST_EXIT_CODES,
    TERMINATION_MESSAGE_PATH,
    ExitCode,
    Rejoin,
    parse_rejoin,
)
from tpujob_trainer.failure_report import Reporter, lease_reporter, oom_kills, report_of
from tpujob_trainer.supervisor_state import SupervisorState, read_state, write_state

log = logging.getLogger("tpujob_trainer.rejoin")

# Long enough for the operator to see the root failure and decide (a killed peer's pod fails
# at once; a lost node is usually seen before its peers' collectives time out, so its order
# comes first), short enough that a root failure which itself looks like a lost peer (a real
# collective timeout) is reported late by no more than this.
HOLD_SECONDS = 30.0
ONE_SLICE_HOLD_SECONDS = 10.0
# A reported failure waits for the operator's verdict: the Lease's watch event, a diagnosis,
# the fencing token and the order's way through the pod's downward-API volume, which a kubelet
# refreshes on its own period (about a minute). Past it, the pod ends as an unreported one.
REPORTED_HOLD_SECONDS = 90.0
ENV_NUM_SLICES = "MEGASCALE_NUM_SLICES"  # GKE's, set by the operator on every trainer pod
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# A killed process is gone in milliseconds unless it waits in the kernel, where no signal
# reaches it.
KILL_WAIT_SECONDS = 30.0
POLL_SECONDS = 0.5
# The message of a kill's report: a killed container leaves no termination message of its own.
KILLED_MESSAGE = "the trainer's container was killed (exit 137) and restarted in its pod"


def read_order(path: Path) -> Rejoin | None:
    """The order in `path`; None when there is none or it is not one."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_REJOIN_BYTES + 1)
    except OSError:
        return None
    return parse_rejoin(raw.decode(errors="replace"))


def rejoined_env(env: Mapping[str, str], order: Rejoin) -> dict[str, str]:
    """`env` for a process restarted as `order`'s attempt: the coordinator's host changes,
    its port stays."""
    out = {**env, ENV_ATTEMPT: str(order.attempt)}
    for key in (ENV_JAX_COORDINATOR, ENV_MEGASCALE_COORDINATOR):
        if key in out:
            port = out[key].rpartition(":")[2]
            out[key] = f"{order.coordinator}:{port}" if port else order.coordinator
    return out


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def lost_a_peer(returncode: int) -> bool:
    return returncode in PEER_LOST_EXIT_CODES or returncode == -signal.SIGABRT


def end_again(ended: int) -> int:
    """The exit status of a supervisor started again after it had ended with `ended` on
    purpose: the same end, unless the kubelet would restart the container for it once more."""
    return ExitCode.ENDED_AFTER_KILL if ended in CONTAINER_RESTART_EXIT_CODES else ended


@dataclass
class Supervisor:
    command: Sequence[str]
    env: Mapping[str, str]
    order_file: Path
    hold_seconds: float = HOLD_SECONDS
    poll_seconds: float = POLL_SECONDS
    reporter: Reporter | None = None
    reported_hold_seconds: float = REPORTED_HOLD_SECONDS
    state_file: Path | None = None
    # Set by `stop`, which runs in a signal handler: a plain flag, since a handler that takes
    # a lock (threading.Event.set) can deadlock with the code it interrupted.
    _stopping: bool = False
    _child: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        """Run the child until it ends for good; its exit status."""
        env = {**self.env, ENV_SUPERVISED: "1"}
        attempt = _attempt(env)
        previous = read_state(self.state_file)
        if previous is not None and previous.ended is not None:
            log.warning(
                "started again after ending with exit %d on purpose; ending at once", previous.ended
            )
            return self._end(previous.attempt, end_again(previous.ended))
        if previous is not None:
            order = self._after_kill(env, previous.attempt)
            if order is None:
                return self._end(previous.attempt, ExitCode.ENDED_AFTER_KILL)
            log.warning(
                "rejoining as attempt %d (coordinator %s)", order.attempt, order.coordinator
            )
            attempt, env = order.attempt, rejoined_env(env, order)
        while True:
            write_state(self.state_file, SupervisorState(attempt))
            ooms = oom_kills()
            child = self._start(env)
            order = self._watch(child, attempt)
            if order is None:
                code = child.returncode
                if self._stopping or code == 0:
                    return self._end(attempt, exit_status(code))
                hold = self._hold_for(env, attempt, code, ooms)
                if hold is None:
                    return self._end(attempt, exit_status(code))
                log.warning(
                    "the training process ended (exit %s); waiting up to %.0fs for a rejoin order",
                    exit_status(code),
                    hold,
                )
                order = self._await_order(attempt, hold)
                if order is None:
                    return self._end(attempt, exit_status(code))
            else:
                child.kill()
                try:
                    child.wait(timeout=KILL_WAIT_SECONDS)
                except subprocess.TimeoutExpired:
                    # Stuck in the kernel (a device driver's wait): this pod cannot rejoin.
                    # Ending it shows the operator a failed pod, which it replaces.
                    log.error(
                        "the training process did not end %.0fs after SIGKILL; not rejoining",
                        KILL_WAIT_SECONDS,
                    )
                    return self._end(attempt, exit_status(-signal.SIGKILL))
            log.warning(
                "rejoining as attempt %d (coordinator %s)", order.attempt, order.coordinator
            )
            attempt, env = order.attempt, rejoined_env(env, order)

    def stop(self, signum: int) -> None:
        """Pass `signum` to the child and end once it has ended (no rejoin after it)."""
        self._stopping = True
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def _end(self, attempt: int, code: int) -> int:
        """End with `code`, on purpose: the state file says so before the container ends."""
        write_state(self.state_file, SupervisorState(attempt, code))
        return code

    def _after_kill(self, env: Mapping[str, str], attempt: int) -> Rejoin | None:
        """Report that the container was killed while it ran `attempt` and hold for an order;
        the order, or None when no report could be written or no order came."""
        report = replace(
            report_of(
                env, attempt=attempt, returncode=-signal.SIGKILL, oom_before=None, oom_after=None
            ),
            reason=CONTAINER_KILLED_REASON,
            message=KILLED_MESSAGE,
        )
        if self._stopping or self.reporter is None or not self.reporter(report):
            log.warning("the container was killed while it ran attempt %d; not reported", attempt)
            return None
        log.warning(
            "the container was killed while it ran attempt %d; waiting up to %.0fs for a "
            "rejoin order",
            attempt,
            self.reported_hold_seconds,
        )
        return self._await_order(attempt, self.reported_hold_seconds)

    def _start(self, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        # The message of a process that ended before is not this one's.
        message = Path(env.get(ENV_TERMINATION_MESSAGE_PATH) or TERMINATION_MESSAGE_PATH)
        if message.is_file():
            message.write_bytes(b"")
        # The supervisor runs no thread of its own, so a preexec function is safe here.
        self._child = subprocess.Popen(
            list(self.command),
            env=dict(env),
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
        if self._stopping:  # a SIGTERM that came while it started
            self._child.send_signal(signal.SIGTERM)
        return self._child

    def _watch(self, child: subprocess.Popen[bytes], attempt: int) -> Rejoin | None:
        """Wait for the child to end (None) or for an order to rejoin a newer attempt."""
        while True:
            try:
                child.wait(timeout=self.poll_seconds)
                return None
            except subprocess.TimeoutExpired:
                pass
            order = read_order(self.order_file)
            if order is not None and order.attempt > attempt and not self._stopping:
                return order

    def _hold_for(
        self, env: Mapping[str, str], attempt: int, code: int, ooms: int | None
    ) -> float | None:
        """How long to hold the pod for an order after the child returned `code`; None: end
        it now. A fenced process is no failure to report: a newer attempt, or another job,
        owns the checkpoints, and only an order for a newer attempt can bring this pod back
        (a kept slice's), so it is held as one that lost a peer."""
        if self.reporter is not None and code != ExitCode.FENCED:
            report = report_of(
                env, attempt=attempt, returncode=code, oom_before=ooms, oom_after=oom_kills()
            )
            if self.reporter(report):
                return self.reported_hold_seconds
        return self.hold_seconds if lost_a_peer(code) else None

    def _await_order(self, attempt: int, hold: float) -> Rejoin | None:
        deadline = time.monotonic() + hold
        while not self._stopping and time.monotonic() < deadline:
            order = read_order(self.order_file)
            if order is not None and order.attempt > attempt:
                return order
            time.sleep(self.poll_seconds)
        return None


def _die_with_parent() -> None:
    """In the child: SIGKILL when the supervisor dies. A container's processes die with its
    main process where the runtime gives it a PID namespace; this makes it so everywhere."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _attempt(env: Mapping[str, str]) -> int:
    try:
        return int(env.get(ENV_ATTEMPT) or 0)
    except ValueError:
        return 0


def supervise(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run `command` under a supervisor reading the order file `env` names; its exit status."""
    state = env.get(ENV_SUPERVISOR_STATE)
    supervisor = Supervisor(
        command,
        env,
        Path(env[ENV_REJOIN_FILE]),
        hold_seconds(env),
        reporter=lease_reporter(env),
        state_file=Path(state) if state else None,
    )

    def forward(signum: int, _frame: FrameType | None) -> None:
        supervisor.stop(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    return supervisor.run()


def hold_seconds(env: Mapping[str, str]) -> float:
    """How long a process that lost a peer waits for an order: `HOLD_SECONDS` in a multislice
    job, where another slice's failure is the usual cause and keeps this one. In a job of one
    slice only a hang's restart in place sends orders, and then the first peer killed breaks
    the others' collectives before their own order may have reached them: a short hold
    (`ONE_SLICE_HOLD_SECONDS`) lets them rejoin, while a real root failure that looks like a
    lost peer is reported late by no more than that, well within any stall timeout."""
    try:
        slices = int(env.get(ENV_NUM_SLICES) or 1)
    except ValueError:
        slices = 1
    return HOLD_SECONDS if slices > 1 else ONE_SLICE_HOLD_SECONDS


def wanted(env: Mapping[str, str]) -> bool:
    """Whether this process should supervise itself: the pod projects a rejoin order and no
    supervisor runs it yet."""
    return bool(env.get(ENV_REJOIN_FILE)) and not env.get(ENV_SUPERVISED)


if __name__ == "__main__":
    # `python -m tpujob_trainer.rejoin COMMAND...`: for trainers of one's own (the SDK loop).
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tpujob_trainer.rejoin COMMAND [ARG...]")
    if not wanted(os.environ):
        os.execvp(sys.argv[1], sys.argv[1:])
    sys.exit(supervise(sys.argv[1:], os.environ))
