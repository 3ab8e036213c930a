"""The trainer/operator failure contract: one source, stable codes, a bounded message."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tpujob_trainer import contract
from tpujob_trainer.contract import (
    EXIT_CODES,
    MAX_MESSAGE_BYTES,
    ClassHint,
    ExitCode,
    TerminationMessage,
    describe_exit_code,
    encode_termination_message,
    parse_termination_message,
)

ROOT = Path(__file__).resolve().parents[2]


BASE = TerminationMessage(
    code="COLLECTIVE_FAILURE",
    exit_code=30,
    class_hint=ClassHint.SOFT,
    summary="Gloo all-reduce failed",
    step=120,
    checkpoint_step=100,
    backend="cpu",
    worker=1,
    traceback="Traceback ...\nJaxRuntimeError: boom\n",
)


def message(**overrides: Any) -> TerminationMessage:
    return replace(BASE, **overrides)


def test_operator_copy_is_byte_identical_to_the_trainer_contract() -> None:
    trainer = ROOT / "trainer_image" / "tpujob_trainer" / "contract.py"
    operator = ROOT / "operator" / "tpujob" / "api" / "contract.py"
    assert operator.read_bytes() == trainer.read_bytes(), (
        "operator/tpujob/api/contract.py drifted; copy the trainer's contract over it"
    )


def test_message_round_trips_through_json() -> None:
    original = message()
    assert parse_termination_message(encode_termination_message(original)) == original


@pytest.mark.parametrize(
    ("summary", "traceback"),
    [
        ("short", "frame\n" * 20_000),
        ("s" * 10_000, "t" * 10_000),
        ('é"\\\n' * 3_000, '\x00\u2603"' * 5_000),
    ],
    ids=["huge-traceback", "huge-summary-and-traceback", "escape-heavy-text"],
)
def test_encoded_message_fits_4kib_and_keeps_the_traceback_tail(
    summary: str, traceback: str
) -> None:
    text = encode_termination_message(message(summary=summary, traceback=traceback + "TAIL"))
    assert len(text.encode()) <= MAX_MESSAGE_BYTES
    parsed = parse_termination_message(text)
    assert parsed is not None and parsed.code == "COLLECTIVE_FAILURE" and parsed.step == 120
    if parsed.traceback:
        assert parsed.traceback.endswith("TAIL")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Error: plain text from a crashed process",
        "[1, 2]",
        json.dumps({"code": 3}),
        json.dumps({"code": "X", "class_hint": "tepid", "exit_code": 1}),
    ],
    ids=["empty", "free-text", "not-an-object", "code-not-a-string", "unknown-class-hint"],
)
def test_anything_not_written_by_the_trainer_parses_to_none(text: str) -> None:
    assert parse_termination_message(text) is None


def test_every_exit_code_but_ok_has_a_meaning() -> None:
    assert set(EXIT_CODES) == set(ExitCode) - {ExitCode.OK}
    for code in ExitCode:
        info = describe_exit_code(int(code))
        assert (info is None) == (code is ExitCode.OK)


@pytest.mark.parametrize("code", list(ExitCode), ids=[c.name for c in ExitCode])
def test_exit_code_never_reads_as_a_shell_or_signal_status(code: ExitCode) -> None:
    assert 0 <= int(code) < 126


def test_failure_codes_are_unique() -> None:
    assert len({info.code for info in EXIT_CODES.values()}) == len(EXIT_CODES)
    assert len({int(c) for c in ExitCode}) == len(ExitCode)


def test_preempted_is_the_retry_code_42_and_soft() -> None:
    assert ExitCode.PREEMPTED == 42
    assert EXIT_CODES[ExitCode.PREEMPTED].hint is ClassHint.SOFT


def test_env_names_the_trainer_reads_are_in_the_contract() -> None:
    assert contract.ENV_FAULTS == "TPUJOB_FAULTS"
    assert contract.ENV_TERMINATION_MESSAGE_PATH == "TPUJOB_TERMINATION_MESSAGE_PATH"


def test_a_rejoin_order_reads_back_as_written() -> None:
    from tpujob_trainer import contract as trainer_contract

    order = trainer_contract.Rejoin(attempt=7, coordinator="job-3-0-0.job.team.svc.cluster.local")
    assert trainer_contract.parse_rejoin(trainer_contract.encode_rejoin(order)) == order


@pytest.mark.parametrize("step", [-1, 2**63, 10**30])
def test_a_step_no_status_could_hold_reads_as_absent(step: int) -> None:
    text = encode_termination_message(message(step=step, checkpoint_step=step, worker=step))
    parsed = parse_termination_message(text)
    assert parsed is not None
    assert (parsed.step, parsed.checkpoint_step, parsed.worker) == (None, None, None)


def test_the_largest_step_a_status_holds_reads_back() -> None:
    parsed = parse_termination_message(encode_termination_message(message(step=2**63 - 1)))
    assert parsed is not None and parsed.step == 2**63 - 1


REPORT = contract.FailureReport(
    attempt=3,
    job_uid="uid-1",
    exit_code=137,
    signal=9,
    reason="OOMKilled",
    message=encode_termination_message(message()),
    at="2026-01-01T00:00:00Z",
)


def test_a_failure_report_reads_back_as_written() -> None:
    assert contract.parse_failure_report(contract.encode_failure_report(REPORT)) == REPORT


def test_a_lost_peers_report_keeps_its_code_and_drops_the_traceback() -> None:
    lost = replace(
        REPORT,
        exit_code=int(ExitCode.COLLECTIVE_FAILURE),
        signal=None,
        message=encode_termination_message(message(traceback="x" * 3000)),
    )
    text = contract.encode_failure_report(lost)
    parsed = contract.parse_failure_report(text)
    assert parsed is not None
    inner = parse_termination_message(parsed.message)
    assert inner is not None and inner.code == "COLLECTIVE_FAILURE" and inner.traceback == ""
    assert len(parsed.message.encode()) <= contract.MAX_PEER_LOST_MESSAGE_BYTES


def test_a_long_free_text_message_keeps_its_tail() -> None:
    text = contract.encode_failure_report(replace(REPORT, message="a" * 9000 + "THE END"))
    parsed = contract.parse_failure_report(text)
    assert parsed is not None and parsed.message.endswith("THE END")
    assert len(text.encode()) <= contract.MAX_FAILURE_REPORT_BYTES


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        '{"attempt":0,"jobUid":"u","exitCode":1,"signal":null,"reason":"E","message":"","at":""}',
        '{"attempt":true,"jobUid":"u","exitCode":1,"signal":null,"reason":"E","message":"","at":""}',
        '{"attempt":1,"jobUid":"u","exitCode":1e400,"signal":null,"reason":"E","message":"","at":""}',
        '{"attempt":1,"jobUid":"u","exitCode":1,"signal":99,"reason":"E","message":"","at":""}',
        '{"attempt":1,"jobUid":7,"exitCode":1,"signal":null,"reason":"E","message":"","at":""}',
        '{"attempt":1,"jobUid":"u","exitCode":1,"signal":null,"reason":"E","message":"'
        + "x" * 9000
        + '","at":""}',
    ],
)
def test_a_failure_report_that_is_not_one_is_none(text: str | None) -> None:
    assert contract.parse_failure_report(text) is None
