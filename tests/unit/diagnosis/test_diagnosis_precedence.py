"""Layers decide in order: user rules, node facts, trainer code, text, exit code, default."""

from __future__ import annotations

import pytest

from tpujob.api import contract
from tpujob.diagnosis import (
    FailureClass,
    FailureCode,
    NodeFacts,
    Source,
    UserRule,
    WorkerFacts,
    diagnose_worker,
)
from tpujob.diagnosis.facts import DISRUPTION_PREEMPTION, TAINT_UNREACHABLE

SHAPE_LOG = "ValueError: cannot reshape array of size 2 into shape (1,64)"


def trainer_message(code: str, hint: contract.ClassHint, exit_code: int) -> str:
    return contract.encode_termination_message(
        contract.TerminationMessage(
            code=code, exit_code=exit_code, class_hint=hint, summary=f"{code} reported", step=7
        )
    )


def test_user_rule_outranks_node_facts_and_text() -> None:
    rule = UserRule(
        failure_class=FailureClass.SOFT,
        code=FailureCode.DATA_ERROR,
        message_regex=r"cannot reshape",
        name="reshape-is-flaky",
    )
    facts = WorkerFacts(log_tail=SHAPE_LOG, node=NodeFacts(name="n", ready="False"))
    diagnosis = diagnose_worker(facts, user_rules=[rule])
    assert (diagnosis.failure_class, diagnosis.code) == (FailureClass.SOFT, FailureCode.DATA_ERROR)
    assert diagnosis.evidence[0].source is Source.USER_RULE


def test_user_rule_needs_every_condition() -> None:
    rule = UserRule(failure_class=FailureClass.SOFT, exit_codes=(3,), message_regex="reshape")
    diagnosis = diagnose_worker(WorkerFacts(exit_code=1, log_tail=SHAPE_LOG), user_rules=[rule])
    assert diagnosis.code is FailureCode.SHAPE_MISMATCH


def test_user_rule_without_conditions_never_matches() -> None:
    rule = UserRule(failure_class=FailureClass.SOFT)
    assert diagnose_worker(WorkerFacts(exit_code=127), user_rules=[rule]).code is (
        FailureCode.COMMAND_NOT_FOUND
    )


def test_first_user_rule_wins() -> None:
    rules = [
        UserRule(failure_class=FailureClass.HARD, exit_codes=(1,), name="first"),
        UserRule(failure_class=FailureClass.SOFT, exit_codes=(1,), name="second"),
    ]
    assert diagnose_worker(WorkerFacts(exit_code=1), user_rules=rules).rule == "first"


def test_node_facts_outrank_trainer_code_and_text() -> None:
    facts = WorkerFacts(
        exit_code=30,
        message=trainer_message("COLLECTIVE_FAILURE", contract.ClassHint.SOFT, 30),
        log_tail="Gloo all-reduce failed: Connection closed by peer",
        node=NodeFacts(name="tpu-node-3", taints=(TAINT_UNREACHABLE,)),
    )
    diagnosis = diagnose_worker(facts)
    assert (diagnosis.failure_class, diagnosis.code) == (FailureClass.HARD, FailureCode.NODE_LOST)
    assert "tpu-node-3" in str(diagnosis.chain[0])


def test_disruption_target_outranks_exit_code() -> None:
    diagnosis = diagnose_worker(WorkerFacts(exit_code=143, disruption=DISRUPTION_PREEMPTION))
    assert diagnosis.code is FailureCode.PREEMPTED


def test_maintenance_taint_is_soft_not_a_node_fault() -> None:
    node = NodeFacts(
        name="n", ready="False", taints=("cloud.google.com/impending-node-termination",)
    )
    diagnosis = diagnose_worker(WorkerFacts(exit_code=143, node=node))
    assert (diagnosis.failure_class, diagnosis.code) == (FailureClass.SOFT, FailureCode.MAINTENANCE)


def test_dropped_tpu_allocatable_is_hard() -> None:
    node = NodeFacts(name="n", tpu_allocatable=2, tpu_requested=4)
    assert diagnose_worker(WorkerFacts(exit_code=1, node=node)).code is FailureCode.TPU_UNHEALTHY


def test_trainer_code_outranks_text_regexes() -> None:
    facts = WorkerFacts(
        exit_code=23,
        message=trainer_message("HBM_OOM", contract.ClassHint.FATAL, 23),
        log_tail="Connection reset by peer",
    )
    diagnosis = diagnose_worker(facts)
    assert (diagnosis.failure_class, diagnosis.code) == (FailureClass.FATAL, FailureCode.HBM_OOM)
    assert diagnosis.step == 7


def test_trainer_unknown_code_lets_text_decide() -> None:
    facts = WorkerFacts(
        exit_code=1,
        message=trainer_message("UNKNOWN", contract.ClassHint.MEDIUM, 1),
        log_tail=SHAPE_LOG,
    )
    assert diagnose_worker(facts).code is FailureCode.SHAPE_MISMATCH


def test_text_outranks_exit_code() -> None:
    # An abort (XLA's own, on SIGABRT) is the process's own end: its log says why.
    facts = WorkerFacts(exit_code=134, log_tail="Ran out of memory in memory space hbm")
    assert diagnose_worker(facts).code is FailureCode.HBM_OOM_AT_COMPILE


def test_free_text_termination_message_is_searched() -> None:
    facts = WorkerFacts(exit_code=1, message="ImportError: cannot import name 'runtime'")
    diagnosis = diagnose_worker(facts)
    assert diagnosis.failure_class is FailureClass.FATAL
    assert diagnosis.evidence[0].source is Source.MESSAGE


def test_a_configured_timeout_in_a_log_line_is_not_a_lost_peer() -> None:
    # A SIGKILLed worker whose log tail only reports its settings at start-up.
    tail = (
        "INFO joining job: process 1 of 2, coordinator w0:8476, heartbeat timeout 15s\n"
        "INFO step 30/60 loss=0.19"
    )
    killed = diagnose_worker(WorkerFacts(worker_index=1, exit_code=137, message=tail))
    assert killed.code is FailureCode.PROCESS_KILLED
    lost = diagnose_worker(
        WorkerFacts(
            worker_index=0,
            exit_code=1,
            message="UNAVAILABLE: Task 1 heartbeat timeout. The remote task has failed",
        )
    )
    assert lost.code is FailureCode.COLLECTIVE_TIMEOUT


TF_NO_KERNEL_LOG = (
    "tensorflow.python.framework.errors_impl.NotFoundError: No OpKernel was registered to"
    " support Op 'ConfigureDistributedTPU' used by {{node ConfigureDistributedTPU}}"
)


@pytest.mark.parametrize(
    ("log", "exit_code", "reason", "expected"),
    [
        (SHAPE_LOG, 137, "Error", (FailureClass.SOFT, FailureCode.PROCESS_KILLED)),
        (TF_NO_KERNEL_LOG, 137, "Error", (FailureClass.SOFT, FailureCode.PROCESS_KILLED)),
        (SHAPE_LOG, 143, "Error", (FailureClass.SOFT, FailureCode.PROCESS_KILLED)),
        (SHAPE_LOG, 1, "Error", (FailureClass.FATAL, FailureCode.SHAPE_MISMATCH)),
        (TF_NO_KERNEL_LOG, 1, "Error", (FailureClass.FATAL, None)),
    ],
    ids=[
        "shape-then-sigkill",
        "tf-kernel-then-sigkill",
        "shape-then-sigterm",
        "shape-exit-1",
        "tf-kernel-exit-1",
    ],
)
def test_a_process_killed_from_outside_is_not_failed_for_what_its_log_said_before(
    log: str, exit_code: int, reason: str, expected: tuple[FailureClass, FailureCode | None]
) -> None:
    diagnosis = diagnose_worker(WorkerFacts(exit_code=exit_code, reason=reason, log_tail=log))
    failure_class, code = expected
    assert diagnosis.failure_class is failure_class
    assert code is None or diagnosis.code is code


def test_a_killed_process_whose_log_blames_its_host_is_still_graded_by_the_log() -> None:
    log = "TPU initialization failed: the TPU chip reported an uncorrectable ECC error (HBM)"
    diagnosis = diagnose_worker(WorkerFacts(exit_code=137, reason="Error", log_tail=log))
    assert diagnosis.failure_class is FailureClass.HARD, diagnosis
