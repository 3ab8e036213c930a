"""Every failure class is reached through the layer that should decide it."""

from __future__ import annotations

import pytest

from tpujob.diagnosis import (
    FailureClass,
    FailureCode,
    NodeFacts,
    PendingFacts,
    WorkerFacts,
    diagnose_worker,
    tag,
)
from tpujob.diagnosis.facts import HeartbeatFacts

CASES = [
    # (id, facts, class, code)
    (
        "gloo-peer-closed-is-soft",
        WorkerFacts(
            log_tail="JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: Connection closed by peer"
        ),
        FailureClass.SOFT,
        FailureCode.COLLECTIVE_FAILURE,
    ),
    (
        "preemption-notice-is-soft",
        WorkerFacts(message="Pod was terminated in response to imminent node shutdown."),
        FailureClass.SOFT,
        FailureCode.PREEMPTED,
    ),
    (
        "sigkill-without-oom-is-soft",
        WorkerFacts(exit_code=137, reason="Error"),
        FailureClass.SOFT,
        FailureCode.PROCESS_KILLED,
    ),
    (
        "container-lost-with-its-node-restart-is-hard",
        WorkerFacts(exit_code=255, reason="Unknown", node=NodeFacts(name="n1", ready="True")),
        FailureClass.HARD,
        FailureCode.NODE_LOST,
    ),
    (
        "a-program-exiting-255-is-not-a-lost-node",
        WorkerFacts(exit_code=255, reason="Error", node=NodeFacts(name="n1", ready="True")),
        FailureClass.MEDIUM,
        FailureCode.UNKNOWN,
    ),
    (
        "oom-killed-is-medium",
        WorkerFacts(exit_code=137, reason="OOMKilled"),
        FailureClass.MEDIUM,
        FailureCode.HOST_OOM,
    ),
    (
        "barrier-timeout-is-medium",
        WorkerFacts(log_tail="XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Id: sync"),
        FailureClass.MEDIUM,
        FailureCode.COLLECTIVE_TIMEOUT,
    ),
    (
        "rate-limit-is-medium",
        WorkerFacts(log_tail="HfHubHTTPError: 429 Client Error: Too Many Requests for url"),
        FailureClass.MEDIUM,
        FailureCode.RATE_LIMITED,
    ),
    (
        "unknown-text-is-medium-default",
        WorkerFacts(exit_code=1, log_tail="something odd happened"),
        FailureClass.MEDIUM,
        FailureCode.UNKNOWN,
    ),
    (
        "bad-tpu-chip-is-hard",
        WorkerFacts(log_tail="Megascale detects a hang that is likely caused by bad TPU chips"),
        FailureClass.HARD,
        FailureCode.TPU_UNHEALTHY,
    ),
    (
        "missing-device-file-is-hard",
        WorkerFacts(log_tail="RuntimeError: /dev/accel0 is not found"),
        FailureClass.HARD,
        FailureCode.TPU_UNHEALTHY,
    ),
    (
        "node-not-ready-is-hard",
        WorkerFacts(exit_code=137, node=NodeFacts(name="n1", ready="Unknown")),
        FailureClass.HARD,
        FailureCode.NODE_LOST,
    ),
    (
        "hbm-oom-at-compile-is-fatal",
        WorkerFacts(
            log_tail="XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. "
            "Ran out of memory in memory space hbm. Used 21.95G of 15.48G hbm."
        ),
        FailureClass.FATAL,
        FailureCode.HBM_OOM_AT_COMPILE,
    ),
    (
        "shape-error-is-fatal",
        WorkerFacts(
            log_tail="Traceback (most recent call last):\n"
            "TypeError: dot_general requires contracting dimensions to have the same shape,"
            " got (128,) and (64,)."
        ),
        FailureClass.FATAL,
        FailureCode.SHAPE_MISMATCH,
    ),
    (
        "jaxlib-version-is-fatal",
        WorkerFacts(
            log_tail="RuntimeError: jaxlib is version 0.3.25, but this version of jax"
            " requires version >= 0.4.19."
        ),
        FailureClass.FATAL,
        FailureCode.VERSION_MISMATCH,
    ),
    (
        "exit-127-is-fatal",
        WorkerFacts(exit_code=127),
        FailureClass.FATAL,
        FailureCode.COMMAND_NOT_FOUND,
    ),
    (
        "unsupported-op-is-fatal",
        WorkerFacts(
            log_tail="Compilation failure: Detected unsupported operations when trying"
            " to compile graph on XLA_TPU_JIT: ResizeNearestNeighbor"
        ),
        FailureClass.FATAL,
        FailureCode.XLA_UNSUPPORTED_OP,
    ),
    (
        "unschedulable-is-medium",
        WorkerFacts(
            pending=PendingFacts("0/4 nodes are available: 4 Insufficient google.com/tpu.")
        ),
        FailureClass.MEDIUM,
        FailureCode.UNSCHEDULABLE,
    ),
    (
        "stalled-heartbeat-is-a-soft-hang",
        WorkerFacts(heartbeat=HeartbeatFacts(seconds_since=900, stall_timeout=600, step=12)),
        FailureClass.SOFT,
        FailureCode.HANG,
    ),
    (
        "trainer-exit-code-from-contract",
        WorkerFacts(exit_code=21),
        FailureClass.FATAL,
        FailureCode.SHAPE_MISMATCH,
    ),
]


@pytest.mark.parametrize(
    ("facts", "expected_class", "expected_code"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_failure_is_classified_by_its_mechanism(
    facts: WorkerFacts, expected_class: FailureClass, expected_code: FailureCode
) -> None:
    diagnosis = diagnose_worker(facts)
    assert (diagnosis.failure_class, diagnosis.code) == (expected_class, expected_code)
    assert diagnosis.evidence, "a diagnosis always shows what it matched"
    assert diagnosis.headline.startswith(tag(expected_class))


def test_every_class_is_covered_by_the_table_above() -> None:
    assert {case[2] for case in CASES} == set(FailureClass)


@pytest.mark.parametrize(
    ("failure_class", "prefix"),
    [
        (FailureClass.SOFT, "[SOFT]"),
        (FailureClass.MEDIUM, "[MEDIUM]"),
        (FailureClass.HARD, "[HARD]"),
        (FailureClass.FATAL, "[FATAL]"),
    ],
    ids=["soft", "medium", "hard", "fatal"],
)
def test_tags_prefix_log_lines_and_events(failure_class: FailureClass, prefix: str) -> None:
    assert tag(failure_class) == prefix


def test_fatal_diagnosis_carries_advice_and_evidence_line() -> None:
    line = "ValueError: cannot reshape array of size 2 into shape (1,64)"
    diagnosis = diagnose_worker(WorkerFacts(log_tail=f"step 10\n{line}\nexiting"))
    assert diagnosis.failure_class is FailureClass.FATAL
    assert diagnosis.advice
    assert diagnosis.evidence[0].detail == line


def test_device_busy_is_soft_unless_context_says_the_node_keeps_failing() -> None:
    text = "TPU initialization failed: open(/dev/vfio/0): Device or resource busy"
    alone = diagnose_worker(WorkerFacts(log_tail=text))
    repeated = diagnose_worker(
        WorkerFacts(log_tail=text, context="jobs fail repeatedly on certain nodes")
    )
    assert alone.failure_class is FailureClass.SOFT
    assert repeated.failure_class is FailureClass.HARD
    assert alone.code is repeated.code is FailureCode.DEVICE_BUSY
