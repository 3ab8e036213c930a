"""`tpujob diagnose`: one failure in, a tagged explanation out; `--eval` scores a corpus."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tpujob.cli import build_parser
from tpujob.diagnosis import cli
from tpujob.diagnosis.model import DEFAULT_ACTIONS, Confidence, Diagnosis, FailureClass, FailureCode


def run_all(argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    """The exit status, stdout and stderr of `tpujob diagnose ARGV`."""
    args = build_parser("diagnose").parse_args(["diagnose", *argv])
    out, err = io.StringIO(), io.StringIO()
    status = cli.run(args, out=out, stdin=io.StringIO(stdin), err=err)
    return status, out.getvalue(), err.getvalue()


def run(argv: list[str], stdin: str = "") -> tuple[int, str]:
    status, out, _ = run_all(argv, stdin)
    return status, out


def test_log_from_stdin_prints_tagged_headline_chain_and_evidence() -> None:
    status, out = run(["--log", "-"], stdin="x\nRan out of memory in memory space hbm\n")
    assert status == 0
    first = out.splitlines()[0]
    assert first.startswith("[FATAL] HBM_OOM_AT_COMPILE")
    assert "log: Ran out of memory in memory space hbm" in out
    assert "advice:" in out


def test_json_output_from_file_with_exit_code_and_reason(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("training step 5\n")
    status, out = run(["--log", str(log), "--exit-code", "137", "--reason", "OOMKilled", "--json"])
    data = json.loads(out)
    assert status == 0
    assert (data["class"], data["code"]) == ("medium", "HOST_OOM")


def test_context_changes_the_verdict() -> None:
    busy = "open(/dev/vfio/0): Device or resource busy"
    _, alone = run(["--log", "-", "--json"], stdin=busy)
    _, noted = run(["--log", "-", "--json", "--context", "fails on the same node"], stdin=busy)
    assert (json.loads(alone)["class"], json.loads(noted)["class"]) == ("soft", "hard")


def test_eval_prints_scores_confusion_and_final_line(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    rows = [
        {"id": "a", "text": "Connection closed by peer", "context": "", "label": "soft"},
        {"id": "b", "text": "ImportError: no module x", "context": "", "label": "fatal"},
        {"id": "c", "text": "Connection closed by peer", "context": "", "label": "fatal"},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    status, out = run(["--eval", str(corpus)])
    assert status == 0
    assert "precision" in out and "confusion" in out
    assert "miss c" in out
    assert out.strip().splitlines()[-1] == (
        "accuracy=0.667 n=3 fatal_retried=1 retryable_failed=0 retryable_failed_share=0.000"
        " unknown_rate=0.000 default_rate=0.000"
    )


def test_eval_counts_reports_no_mechanism_named_as_unknown(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    rows = [
        {"id": "a", "text": "Connection closed by peer", "context": "", "label": "soft"},
        {"id": "b", "text": "zzz qqq", "context": "", "label": "medium"},
        {"id": "c", "text": "TypeError: x", "context": "", "label": "soft"},
        {"id": "d", "text": "ImportError: no module x", "context": "", "label": "fatal"},
    ]
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    _, out = run(["--eval", str(corpus)])
    last = dict(part.split("=") for part in out.strip().splitlines()[-1].split())
    assert (last["unknown_rate"], last["retryable_failed_share"]) == ("0.250", "0.333")


@pytest.mark.parametrize("content", ["not json\n", '{"text": "x"}\n'], ids=["not-json", "no-label"])
def test_eval_rejects_a_malformed_corpus(tmp_path: Path, content: str) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(content)
    status, out, err = run_all(["--eval", str(corpus)])
    assert (status, out) == (2, "")
    assert "line 1" in err


def test_malformed_corpus_line_is_refused_with_its_number(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    good = json.dumps({"text": "x", "label": "soft"})
    corpus.write_text(f"{good}\n{good}\n{{broken\n", encoding="utf-8")
    code, out, err = run_all(["--eval", str(corpus)])
    assert (code, out) == (2, "")
    assert "line 3" in err


@pytest.mark.timeout(60)
def test_huge_log_is_diagnosed_from_its_tail(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    filler = "I0101 step ok loss 1.23 aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"
    with log.open("w", encoding="utf-8") as handle:
        handle.write(filler * (10_000_000 // len(filler)))
        handle.write("ImportError: cannot import name 'shard_map' from 'jax'\n")
    code, out = run(["--log", str(log), "--json"])
    assert code == 0
    assert json.loads(out)["class"] == "fatal"


def weak_guess(cls: FailureClass, confidence: Confidence) -> Diagnosis:
    return Diagnosis(
        failure_class=cls,
        code=FailureCode.UNKNOWN,
        summary="no rule names this failure",
        confidence=confidence,
        rule="text-model",
        probability=0.65,
        action=DEFAULT_ACTIONS[cls],
    )


@pytest.mark.parametrize(
    ("cls", "confidence", "headline", "action"),
    [
        (
            FailureClass.FATAL,
            Confidence.LOW,
            "[MEDIUM] UNKNOWN: no rule names this failure; too weak a guess to act on: restarted"
            " once, a repeat decides",
            DEFAULT_ACTIONS[FailureClass.MEDIUM],
        ),
        (
            FailureClass.HARD,
            Confidence.LOW,
            "[MEDIUM] UNKNOWN: no rule names this failure; too weak a guess to act on: restarted"
            " once, a repeat decides",
            DEFAULT_ACTIONS[FailureClass.MEDIUM],
        ),
        (
            FailureClass.FATAL,
            Confidence.MEDIUM,
            "[FATAL] UNKNOWN: no rule names this failure",
            DEFAULT_ACTIONS[FailureClass.FATAL],
        ),
    ],
    ids=["weak-fatal", "weak-hard", "confident-fatal"],
)
def test_the_verdict_printed_is_the_one_the_operator_acts_on(
    cls: FailureClass,
    confidence: Confidence,
    headline: str,
    action: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli, "diagnose_worker", lambda *_, **__: weak_guess(cls, confidence))
    _, out = run(["--log", "-"], stdin="something odd")
    assert (out.splitlines()[0], out.splitlines()[-1]) == (headline, f"action: {action}")
    _, out = run(["--log", "-", "--json"], stdin="something odd")
    assert json.loads(out)["action"] == action


@pytest.mark.parametrize(
    "argv", [[], ["--json"], ["--explain"], ["--context", "fails on one node"]], ids=str
)
def test_no_fact_of_a_failure_is_refused_with_usage_on_stderr(argv: list[str]) -> None:
    status, out, err = run_all(argv)
    assert (status, out) == (2, "")
    assert len(err.splitlines()) == 1 and "usage: tpujob diagnose" in err


@pytest.mark.parametrize(
    "argv",
    [["--exit-code", "137"], ["--reason", "OOMKilled"], ["--message", "x"], ["--log", "-"]],
    ids=str,
)
def test_any_one_fact_is_enough_to_diagnose(argv: list[str]) -> None:
    status, out, err = run_all(argv)
    assert (status, err) == (0, "")
    assert out.startswith("[")


@pytest.mark.parametrize(
    "argv",
    [["--log", "/nonexistent/worker.log"], ["--exit-code", "1", "--site-rules", "/nonexistent"]],
    ids=["missing-log", "missing-site-rules"],
)
def test_errors_go_to_stderr_with_status_2(argv: list[str]) -> None:
    status, out, err = run_all(argv)
    assert (status, out) == (2, "")
    assert err.startswith("tpujob diagnose: ") and "/nonexistent" in err


@pytest.mark.parametrize(
    ("confidence", "told"), [(Confidence.LOW, True), (Confidence.MEDIUM, False)], ids=str
)
def test_explain_ends_with_the_operators_regrade_of_a_weak_guess(
    confidence: Confidence, told: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    guess = weak_guess(FailureClass.FATAL, confidence)
    monkeypatch.setattr(cli, "diagnose_worker", lambda *_, **__: guess)
    _, out = run(["--log", "-", "--explain"], stdin="something odd")
    operator_said = out.splitlines()[-1] == f"action: {DEFAULT_ACTIONS[FailureClass.MEDIUM]}"
    assert operator_said is told
