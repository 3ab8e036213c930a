"""`tpujob diagnose`: one failure in, a tagged explanation out; `--eval` scores a corpus."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from tpujob.cli import build_parser
from tpujob.diagnosis import cli


def run(argv: list[str], stdin: str = "") -> tuple[int, str]:
    args = build_parser("diagnose").parse_args(["diagnose", *argv])
    out = io.StringIO()
    status = cli.run(args, out=out, stdin=io.StringIO(stdin))
    return status, out.getvalue()


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
    status, out = run(["--eval", str(corpus)])
    assert status == 2
    assert "line 1" in out


def test_malformed_corpus_line_is_refused_with_its_number(tmp_path: Path) -> None:
    corpus = tmp_path / "bad.jsonl"
    good = json.dumps({"text": "x", "label": "soft"})
    corpus.write_text(f"{good}\n{good}\n{{broken\n", encoding="utf-8")
    code, out = run(["--eval", str(corpus)])
    assert code == 2
    assert "line 3" in out


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
