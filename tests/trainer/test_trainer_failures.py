"""Exceptions reaching the top become a contract code and a termination message."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpujob_trainer.contract import ExitCode, parse_termination_message
from tpujob_trainer.failures import (
    FailureContext,
    TrainerError,
    classify_exception,
    report_exception,
)
from tpujob_trainer.inject import IMPOSSIBLE_HOST_BYTES

pytestmark = pytest.mark.trainer


def _raise_shape_error() -> None:
    jnp.ones((2, 3)) @ jnp.ones((4, 1))


def _raise_host_oom() -> None:
    np.empty(IMPOSSIBLE_HOST_BYTES, dtype=np.uint8)


def _raise(error: BaseException) -> Callable[[], None]:
    def raiser() -> None:
        raise error

    return raiser


RuntimeErr = jax.errors.JaxRuntimeError

CASES: list[tuple[Callable[[], None], ExitCode]] = [
    (_raise_shape_error, ExitCode.SHAPE_MISMATCH),
    (_raise_host_oom, ExitCode.HOST_OOM),
    (_raise(RuntimeErr("RESOURCE_EXHAUSTED: Out of memory allocating 1.0T")), ExitCode.HBM_OOM),
    (
        _raise(RuntimeErr("UNKNOWN: Gloo all-reduce failed: Connection closed by peer")),
        ExitCode.COLLECTIVE_FAILURE,
    ),
    (_raise(RuntimeErr("UNAVAILABLE: Task 1 heartbeat timeout")), ExitCode.COLLECTIVE_FAILURE),
    (_raise(RuntimeErr("DEADLINE_EXCEEDED: Barrier timed out")), ExitCode.COORDINATION_TIMEOUT),
    (_raise(TrainerError(ExitCode.DEVICE_BUSY, "busy")), ExitCode.DEVICE_BUSY),
    (_raise(KeyError("params")), ExitCode.USER_CODE_ERROR),
    (_raise(RuntimeError("something odd")), ExitCode.UNKNOWN_ERROR),
]


@pytest.mark.parametrize(
    ("failing", "expected"),
    CASES,
    ids=[
        "jax-shape-error",
        "host-allocation-failure",
        "resource-exhausted",
        "gloo-peer-closed",
        "coordination-heartbeat-timeout",
        "deadline-exceeded",
        "known-trainer-error",
        "plain-user-bug",
        "anything-else",
    ],
)
def test_exceptions_map_to_contract_codes(failing: Callable[[], None], expected: ExitCode) -> None:
    with pytest.raises(BaseException) as caught:
        failing()
    assert classify_exception(caught.value) is expected


def test_report_writes_a_parseable_message_and_the_traceback_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "termination-log"
    monkeypatch.setenv("TPUJOB_TERMINATION_MESSAGE_PATH", str(path))
    try:
        _raise_shape_error()
    except TypeError as error:
        code = report_exception(error, FailureContext(step=7, checkpoint_step=5, backend="cpu"))
    assert code is ExitCode.SHAPE_MISMATCH
    message = parse_termination_message(path.read_text())
    assert message is not None
    assert (message.code, message.exit_code, message.step, message.checkpoint_step) == (
        "SHAPE_MISMATCH",
        21,
        7,
        5,
    )
    assert "dot_general" in message.summary and "_raise_shape_error" in message.traceback
    assert "_raise_shape_error" in capsys.readouterr().err
    assert len(path.read_bytes()) <= 4096 and json.loads(path.read_text())["backend"] == "cpu"
