"""The rejoin supervisor: a kept pod's training process restarts in place on an order, a root
failure ends the pod at once, and a lost peer waits for the operator's word a while."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tpujob_trainer import contract, rejoin, supervisor_state

pytestmark = pytest.mark.trainer

# Records the attempt and coordinator it was started with, then acts on $BEHAVIOUR_<attempt>:
# "exit:N", "kill" (SIGKILL itself), "sigterm:N" (wait for SIGTERM, exit N), else sleep.
CHILD = """
import json, os, signal, sys, time
env = os.environ
with open(env["RECORD"], "a") as f:
    f.write(json.dumps({k: env.get(k) for k in (
        "TPUJOB_ATTEMPT", "JAX_COORDINATOR_ADDRESS", "MEGASCALE_COORDINATOR_ADDRESS",
        "TPUJOB_SUPERVISED")}) + "\\n")
message = env.get("TPUJOB_TERMINATION_MESSAGE_PATH")
if message:
    with open(message) as f:
        seen = f.read()
    with open(env["RECORD"] + ".messages", "a") as f:
        f.write(json.dumps(seen) + "\\n")
    with open(message, "w") as f:
        f.write("attempt " + env["TPUJOB_ATTEMPT"])
what = env.get("BEHAVIOUR_" + env["TPUJOB_ATTEMPT"], "sleep")
if what.startswith("exit:"):
    sys.exit(int(what[5:]))
if what == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if what.startswith("sigterm:"):
    code = int(what[8:])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(code))
time.sleep(60)
"""


def supervisor(
    tmp_path: Path,
    hold: float = 30.0,
    reporter: rejoin.Reporter | None = None,
    reported_hold: float = 30.0,
    **behaviour: str,
) -> rejoin.Supervisor:
    (tmp_path / "termination").write_text("")  # the kubelet makes the file before the start
    env = {
        "RECORD": str(tmp_path / "record"),
        contract.ENV_ATTEMPT: "1",
        contract.ENV_JAX_COORDINATOR: "job-1-0-0.job.ns.svc.cluster.local:8476",
        contract.ENV_MEGASCALE_COORDINATOR: "job-1-0-0.job.ns.svc.cluster.local:8080",
        contract.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination"),
        **{f"BEHAVIOUR_{k[1:]}": v for k, v in behaviour.items()},
    }
    return rejoin.Supervisor(
        [sys.executable, "-c", CHILD],
        env,
        tmp_path / "order",
        hold_seconds=hold,
        poll_seconds=0.05,
        reporter=reporter,
        reported_hold_seconds=reported_hold,
    )


def records(tmp_path: Path) -> list[dict[str, str]]:
    path = tmp_path / "record"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def order(tmp_path: Path, attempt: int, host: str, *, after: float = 0.0) -> threading.Thread:
    """Write the rejoin order `after` seconds from now (once the first child has started)."""

    def write() -> None:
        deadline = time.monotonic() + 30
        while not records(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(after)
        tmp = tmp_path / "order.new"
        tmp.write_text(contract.encode_rejoin(contract.Rejoin(attempt, host)))
        tmp.replace(tmp_path / "order")

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def test_an_order_restarts_a_running_process_as_the_new_attempt_with_its_coordinator(
    tmp_path: Path,
) -> None:
    order(tmp_path, 2, "job-2-0-0.job.ns.svc.cluster.local")
    assert supervisor(tmp_path, a2="exit:0").run() == 0
    first, second = records(tmp_path)
    assert first["TPUJOB_ATTEMPT"] == "1" and first["TPUJOB_SUPERVISED"] == "1"
    assert second["TPUJOB_ATTEMPT"] == "2"
    assert second["JAX_COORDINATOR_ADDRESS"] == "job-2-0-0.job.ns.svc.cluster.local:8476"
    assert second["MEGASCALE_COORDINATOR_ADDRESS"] == "job-2-0-0.job.ns.svc.cluster.local:8080"
    # The restarted process does not find the message of the one before it.
    seen = [json.loads(line) for line in (tmp_path / "record.messages").read_text().splitlines()]
    assert seen == ["", ""]


def test_a_process_that_lost_its_peer_waits_for_the_order_and_rejoins(tmp_path: Path) -> None:
    order(tmp_path, 2, "job-1-0-0.job.ns.svc.cluster.local", after=0.5)
    code = supervisor(
        tmp_path, a1=f"exit:{int(contract.ExitCode.COLLECTIVE_FAILURE)}", a2="exit:0"
    ).run()
    assert code == 0
    assert [r["TPUJOB_ATTEMPT"] for r in records(tmp_path)] == ["1", "2"]


@pytest.mark.parametrize(
    ("behaviour", "status"),
    [
        ("kill", 128 + signal.SIGKILL),
        (f"exit:{int(contract.ExitCode.SHAPE_MISMATCH)}", int(contract.ExitCode.SHAPE_MISMATCH)),
        ("exit:0", 0),
    ],
)
def test_any_other_end_is_the_pods_end_at_once(tmp_path: Path, behaviour: str, status: int) -> None:
    started = time.monotonic()
    assert supervisor(tmp_path, hold=30, a1=behaviour).run() == status
    assert time.monotonic() - started < 20  # not held for the 30 s a lost peer waits
    assert len(records(tmp_path)) == 1


def test_a_lost_peer_with_no_order_ends_the_pod_after_the_hold(tmp_path: Path) -> None:
    timeout = int(contract.ExitCode.COORDINATION_TIMEOUT)
    assert supervisor(tmp_path, hold=0.5, a1=f"exit:{timeout}").run() == timeout
    assert len(records(tmp_path)) == 1


def test_an_order_for_an_attempt_not_newer_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "order").write_text(contract.encode_rejoin(contract.Rejoin(1, "elsewhere")))
    fenced = int(contract.ExitCode.FENCED)
    assert supervisor(tmp_path, hold=0.5, a1=f"exit:{fenced}").run() == fenced
    assert [r["TPUJOB_ATTEMPT"] for r in records(tmp_path)] == ["1"]


def test_sigterm_goes_to_the_process_and_nothing_rejoins_after_it(tmp_path: Path) -> None:
    sup = supervisor(tmp_path, a1="sigterm:42")

    def terminate() -> None:
        deadline = time.monotonic() + 30
        while not records(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the child's handler is installed after it records
        sup.stop(signal.SIGTERM)
        (tmp_path / "order").write_text(contract.encode_rejoin(contract.Rejoin(2, "late")))

    threading.Thread(target=terminate, daemon=True).start()
    assert sup.run() == 42
    assert len(records(tmp_path)) == 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "garbage",
        "[]",
        '{"attempt": "2", "coordinator": "h"}',
        '{"attempt": 0, "coordinator": "h"}',
        '{"attempt": 2, "coordinator": ""}',
        '{"attempt": 2, "coordinator": "h:1"}',
        '{"attempt": 2, "coordinator": "a b"}',
        '{"attempt": true, "coordinator": "h"}',
        '{"attempt": 2, "coordinator": "' + "h" * 600 + '"}',
    ],
)
def test_an_order_that_is_not_one_is_no_order(tmp_path: Path, text: str) -> None:
    (tmp_path / "order").write_text(text)
    assert rejoin.read_order(tmp_path / "order") is None


@pytest.mark.parametrize(
    ("slices", "hold"),
    [
        (None, rejoin.ONE_SLICE_HOLD_SECONDS),
        ("1", rejoin.ONE_SLICE_HOLD_SECONDS),
        ("2", rejoin.HOLD_SECONDS),
        ("not a number", rejoin.ONE_SLICE_HOLD_SECONDS),
    ],
    ids=["unset", "one-slice", "multislice", "garbled"],
)
def test_a_one_slice_job_holds_a_process_that_lost_its_peer_only_briefly(
    slices: str | None, hold: float
) -> None:
    env = {} if slices is None else {"MEGASCALE_NUM_SLICES": slices}
    assert rejoin.hold_seconds(env) == hold


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({contract.ENV_REJOIN_FILE: "/var/run/tpujob/rejoin"}, True),
        ({contract.ENV_REJOIN_FILE: "/var/run/tpujob/rejoin", contract.ENV_SUPERVISED: "1"}, False),
        ({contract.ENV_REJOIN_FILE: ""}, False),
    ],
)
def test_a_trainer_supervises_itself_only_where_the_pod_projects_an_order(
    env: dict[str, str], wanted: bool
) -> None:
    assert rejoin.wanted(env) is wanted


def test_the_process_dies_with_its_supervisor_as_with_a_containers_main_process(
    tmp_path: Path,
) -> None:
    import os
    import subprocess

    pid_file = tmp_path / "pid"
    child = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    env = {
        **os.environ,
        contract.ENV_REJOIN_FILE: str(tmp_path / "order"),
        contract.ENV_TERMINATION_MESSAGE_PATH: str(tmp_path / "termination"),
    }
    env.pop(contract.ENV_SUPERVISED, None)
    sup = subprocess.Popen(
        [sys.executable, "-m", "tpujob_trainer.rejoin", sys.executable, "-c", child], env=env
    )
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    sup.kill()
    sup.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for whoever adopted it to reap it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(") ", 1)[1].startswith("Z")


def test_no_rejoin_is_a_flag_the_trainer_accepts() -> None:
    from tpujob_trainer.config import load_config
    from tpujob_trainer.contract import NO_REJOIN_FLAG

    assert load_config([NO_REJOIN_FLAG, "--steps", "3"], {}).steps == 3


class Reports:
    """A reporter that records what it was given and answers `accept`."""

    def __init__(self, *, accept: bool = True) -> None:
        self.accept = accept
        self.seen: list[contract.FailureReport] = []

    def __call__(self, report: contract.FailureReport) -> bool:
        self.seen.append(report)
        return self.accept


def test_a_reported_root_failure_holds_the_pod_and_an_order_restarts_it_in_place(
    tmp_path: Path,
) -> None:
    reports = Reports()
    order(tmp_path, 2, "job-1-0-0.job.ns.svc.cluster.local", after=0.5)
    assert supervisor(tmp_path, hold=0.1, reporter=reports, a1="kill", a2="exit:0").run() == 0
    assert [r["TPUJOB_ATTEMPT"] for r in records(tmp_path)] == ["1", "2"]
    (report,) = reports.seen
    assert (report.attempt, report.exit_code, report.signal) == (1, 137, signal.SIGKILL)
    assert report.reason == "Error" and report.message == "attempt 1"  # the child's message


def test_a_reported_failure_no_order_follows_ends_the_pod_with_the_childs_code(
    tmp_path: Path,
) -> None:
    reports = Reports()
    code = int(contract.ExitCode.SHAPE_MISMATCH)
    assert supervisor(tmp_path, reporter=reports, reported_hold=0.3, a1=f"exit:{code}").run() == (
        code
    )
    assert [r.exit_code for r in reports.seen] == [code]
    assert len(records(tmp_path)) == 1


def test_a_report_the_lease_refused_ends_a_root_failure_at_once(tmp_path: Path) -> None:
    reports = Reports(accept=False)
    started = time.monotonic()
    assert supervisor(tmp_path, reporter=reports, reported_hold=30, a1="exit:3").run() == 3
    assert time.monotonic() - started < 20 and len(reports.seen) == 1


def test_a_fenced_process_is_not_reported_and_held_only_as_a_lost_peer(tmp_path: Path) -> None:
    # An orphan of a deleted job, fenced by the new job that took its Lease, must end soon.
    reports = Reports()
    code = int(contract.ExitCode.FENCED)
    started = time.monotonic()
    run = supervisor(tmp_path, hold=0.2, reporter=reports, reported_hold=30, a1=f"exit:{code}")
    assert run.run() == code
    assert reports.seen == [] and time.monotonic() - started < 20


def test_a_successful_end_is_never_reported(tmp_path: Path) -> None:
    reports = Reports()
    assert supervisor(tmp_path, reporter=reports, a1="exit:0").run() == 0
    assert reports.seen == []


# A container killed whole is restarted in its pod; the supervisor learns from its state file.
KILLED = int(contract.ExitCode.ENDED_AFTER_KILL)


def restarted(tmp_path: Path, state: str | None, **kwargs: object) -> rejoin.Supervisor:
    """A supervisor started in a pod whose scratch volume holds `state` (None: no file)."""
    path = tmp_path / "supervisor.json"
    if state is not None:
        path.write_text(state)
    run = supervisor(tmp_path, **kwargs)  # type: ignore[arg-type]
    run.state_file = path
    return run


def state_of(tmp_path: Path) -> tuple[int, int | None]:
    state = supervisor_state.read_state(tmp_path / "supervisor.json")
    assert state is not None
    return state.attempt, state.ended


@dataclass(frozen=True)
class Restart:
    """What a restarted supervisor finds, and what it must do."""

    state: str | None  # the state file's text (None: no file)
    order_attempt: int | None  # the order already projected (None: none)
    code: int  # its exit status
    attempts: tuple[str, ...]  # the attempts its children ran as
    reported: tuple[int, ...]  # the attempts it reported a kill for
    after: tuple[int, int | None]  # the state it leaves
    accept: bool = True  # whether the Lease takes its report


RESTARTS = {
    # The container's first start: it runs the pod's attempt and says how it ended.
    "first-start": Restart(None, None, 0, ("1",), (), (1, 0)),
    "unreadable-state": Restart("not json", None, 0, ("1",), (), (1, 0)),
    # Killed while it ran attempt 3: reported, held, and run again as the order's attempt.
    "killed-then-ordered": Restart('{"attempt":3,"ended":null}', 4, 0, ("4",), (3,), (4, 0)),
    # Killed, and no order newer than the attempt it ran: it ends, not as a restarted code.
    "killed-no-newer-order": Restart(
        '{"attempt":3,"ended":null}', 3, KILLED, (), (3,), (3, KILLED)
    ),
    # Killed, and the Lease refused the report: it ends at once.
    "killed-report-refused": Restart(
        '{"attempt":3,"ended":null}', 4, KILLED, (), (3,), (3, KILLED), accept=False
    ),
    # It had passed a child's SIGKILL on: started again, it must not loop.
    "ended-137": Restart('{"attempt":3,"ended":137}', 4, KILLED, (), (), (3, KILLED)),
    "ended-after-kill": Restart('{"attempt":3,"ended":44}', 4, KILLED, (), (), (3, KILLED)),
    # Killed between deciding on another end and leaving: that end, again.
    "ended-1": Restart('{"attempt":3,"ended":1}', 4, 1, (), (), (3, 1)),
}


@pytest.mark.parametrize("case", RESTARTS.values(), ids=RESTARTS.keys())
def test_a_supervisor_restarted_in_its_pod_acts_on_what_its_predecessor_was_doing(
    tmp_path: Path, case: Restart
) -> None:
    reports = Reports(accept=case.accept)
    if case.order_attempt is not None:
        (tmp_path / "order").write_text(
            contract.encode_rejoin(contract.Rejoin(case.order_attempt, "job-1-0-0.job.ns.svc"))
        )
    run = restarted(
        tmp_path, case.state, reporter=reports, reported_hold=0.5, a1="exit:0", a4="exit:0"
    )
    assert run.run() == case.code
    assert tuple(r["TPUJOB_ATTEMPT"] for r in records(tmp_path)) == case.attempts
    assert tuple(r.attempt for r in reports.seen) == case.reported
    for report in reports.seen:
        # As a killed training process is reported (the operator grades both the same), with
        # the reason that sends the operator to the kubelet's record of the kill.
        assert (report.exit_code, report.signal, report.reason) == (
            137,
            signal.SIGKILL,
            contract.CONTAINER_KILLED_REASON,
        )
        assert report.message == rejoin.KILLED_MESSAGE
    assert state_of(tmp_path) == case.after


def test_a_child_killed_with_no_order_ends_with_137_once_and_the_restart_ends_for_good(
    tmp_path: Path,
) -> None:
    # The kubelet restarts the container for the 137 it passed on; the restart must not loop.
    assert restarted(tmp_path, None, hold=0.1, a1="kill").run() == 137
    assert state_of(tmp_path) == (1, 137)
    assert restarted(tmp_path, None, hold=0.1, a1="kill").run() == KILLED
    assert len(records(tmp_path)) == 1


def test_the_state_file_names_the_attempt_running_while_it_runs(tmp_path: Path) -> None:
    order(tmp_path, 2, "job-2-0-0.job.ns.svc.cluster.local")
    run = restarted(tmp_path, None, a2="sleep")
    thread = threading.Thread(target=run.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while [r["TPUJOB_ATTEMPT"] for r in records(tmp_path)] != ["1", "2"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert state_of(tmp_path) == (2, None)
    run.stop(signal.SIGTERM)
    thread.join(30)
    assert state_of(tmp_path)[0] == 2 and state_of(tmp_path)[1] is not None


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ('{"attempt":2,"ended":null}', supervisor_state.SupervisorState(2)),
        ('{"attempt":2,"ended":137}', supervisor_state.SupervisorState(2, 137)),
        ('{"attempt":-1,"ended":null}', None),
        ('{"attempt":true,"ended":null}', None),
        ('{"attempt":2,"ended":"137"}', None),
        ("[]", None),
        ("", None),
    ],
    ids=["running", "ended", "negative", "bool", "text-code", "list", "empty"],
)
def test_only_a_well_formed_state_is_read(
    text: str, state: supervisor_state.SupervisorState | None
) -> None:
    assert supervisor_state.parse_state(text) == state
    if state is not None:
        assert supervisor_state.parse_state(supervisor_state.encode_state(state)) == state
