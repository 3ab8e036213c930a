"""`--explain`: which entry, rule, site rule or model features decided, and what came second."""

from __future__ import annotations

import io
from argparse import Namespace
from pathlib import Path

from tpujob.diagnosis import FailureClass, WorkerFacts, explain_worker, parse_site_rules
from tpujob.diagnosis.cli import run
from tpujob.diagnosis.engine import Layer

XID = "NVRM: Xid (PCI:0000:2b:00): 94, pid=1234, Contained: SM (0x1). RST: No, D-RST: No"


def test_catalogue_entry_that_decided_is_shown_with_its_documentation() -> None:
    explanation = explain_worker(WorkerFacts(log_tail=XID), model=None)
    decided = explanation.decided
    assert (decided.layer, decided.rule) == (Layer.CATALOGUE, "gpu_xid/xid-94-contained-ecc")
    assert decided.entry is not None
    text = "\n".join(explanation.lines())
    assert decided.entry.documented in text and decided.entry.why in text


def test_runner_up_of_another_class_marks_the_grade_contested() -> None:
    log = "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with error 12\nTypeError: x"
    explanation = explain_worker(WorkerFacts(log_tail=log), model=None)
    assert explanation.decided.failure_class is FailureClass.HARD
    assert explanation.second is not None
    assert explanation.second.failure_class is FailureClass.FATAL
    assert explanation.contested


def test_site_rule_that_decided_comes_before_the_verdict_it_replaced() -> None:
    site = parse_site_rules(
        {
            "rules": [
                {
                    "name": "x",
                    "class": "medium",
                    "why": "w",
                    "set": "2026-11-30",
                    "message_regex": "Contained",
                }
            ]
        }
    )
    explanation = explain_worker(WorkerFacts(log_tail=XID), site_rules=site, model=None)
    assert explanation.decided.layer is Layer.SITE
    assert (
        explanation.second is not None and explanation.second.rule == "gpu_xid/xid-94-contained-ecc"
    )


def test_model_that_decided_is_shown_with_the_features_that_pulled_it() -> None:
    explanation = explain_worker(
        WorkerFacts(log_tail="the loss curve looked odd and then", context="jax tpu v4 pod")
    )
    if explanation.decided.layer is Layer.MODEL:
        assert explanation.decided.features
        assert all(name[:2] in ("w:", "b:", "c:") for name, _ in explanation.decided.features)
    else:
        assert explanation.decided.layer is Layer.DEFAULT


def cli_args(site_rules: Path, *, explain: bool) -> Namespace:
    return Namespace(
        eval=None,
        log="-",
        exit_code=None,
        reason=None,
        message="",
        context="",
        json=False,
        explain=explain,
        site_rules=str(site_rules),
    )


def test_cli_explain_reads_a_site_rule_file(tmp_path: Path) -> None:
    rules = tmp_path / "site.yaml"
    rules.write_text(
        "rules:\n  - {name: x, class: soft, why: w, set: 2026-11-30, message_regex: Contained}\n"
    )
    out = io.StringIO()
    assert run(cli_args(rules, explain=True), out=out, stdin=io.StringIO(XID)) == 0
    printed = out.getvalue()
    assert "site rule site:x: soft" in printed and "site rule 'x', set 2026-11-30: w" in printed
    assert "second (another class):" in printed


def test_cli_refuses_a_malformed_site_rule_file(tmp_path: Path) -> None:
    rules = tmp_path / "site.yaml"
    rules.write_text("rules:\n  - {name: x, class: soft}\n")
    out, err = io.StringIO(), io.StringIO()
    assert run(cli_args(rules, explain=False), out=out, stdin=io.StringIO(XID), err=err) == 2
    assert (out.getvalue(), "required" in err.getvalue()) == ("", True)
