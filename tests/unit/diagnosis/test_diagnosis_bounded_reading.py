"""What a diagnosis reads of a large log: the rules all of the bounded tail, the model a few KB.

These assert on what is read and found, never on time: the cost follows from the bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tpujob.diagnosis import FailureClass, Source, WorkerFacts, diagnose_worker, textmodel, texts
from tpujob.diagnosis.evaluate import facts_from_report, model_text, parse_corpus
from tpujob.diagnosis.linear import compile_linear, replace_all
from tpujob.diagnosis.textmodel import (
    Prediction,
    TextModel,
    bounded_head,
    bounded_tail,
    model_input,
    packaged_model,
    words,
)

CORPUS = Path(__file__).parents[2] / "data" / "corpus" / "errors.jsonl"
CHATTER = "I0101 12:00:01.000 train.py:88] step {} loss 0.1234 throughput 1234.5 tokens/s\n"
MODEL_CAP = textmodel.MAX_CONTEXT_CHARS + textmodel.MAX_MESSAGE_CHARS + textmodel.MAX_LOG_CHARS + 2
# Text that makes every normaliser and the word splitter work hardest: no line breaks, a
# number, hex id, path, address or host every few characters.
PATHOLOGICAL = "a1b2c3 10.0.0.1:8470 0xdeadbeef /a/b/c w-1.pool.internal 12345 "


def _chatter(chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        lines.append(CHATTER.format(len(lines)))
        size += len(lines[-1])
    return "".join(lines)


@dataclass(frozen=True)
class _RecordingModel(TextModel):
    """The packaged model, remembering every text it was asked to read."""

    read: list[str] = field(default_factory=list)

    def predict(self, text: str) -> Prediction:
        self.read.append(text)
        return super().predict(text)


def _recording_model() -> _RecordingModel:
    packaged = packaged_model()
    return _RecordingModel(packaged.classes, packaged.index, packaged.weights, packaged.bias)


@pytest.mark.parametrize("size", [64_000, 10_000_000], ids=["64KB", "10MB"])
def test_a_decisive_line_at_the_end_of_a_huge_tail_is_found(size: int) -> None:
    decisive = "TypeError: dot_general requires contracting dimensions to have the same shape"
    diagnosis = diagnose_worker(WorkerFacts(exit_code=1, log_tail=_chatter(size) + decisive))
    assert diagnosis.failure_class is FailureClass.FATAL
    assert diagnosis.evidence[0].source is Source.LOG
    assert diagnosis.evidence[0].detail == decisive


def test_a_rule_phrase_anywhere_in_the_bounded_tail_is_found() -> None:
    # The rules read the whole bounded tail, not the model's few KB: a node's Event at the
    # start of the last 64 KB still decides.
    event = "Warning NodeNotReady pod/w-0 Node is not ready\n"
    log = event + _chatter(texts.MAX_LOG_CHARS - len(event) - 100)
    assert len(log) <= texts.MAX_LOG_CHARS
    diagnosis = diagnose_worker(WorkerFacts(exit_code=1, log_tail=log))
    assert diagnosis.failure_class is FailureClass.HARD
    assert diagnosis.evidence[0].detail == event.strip()


@pytest.mark.parametrize(
    "log",
    [_chatter(64_000) + "training stopped", (PATHOLOGICAL * 1_100)[:64_000]],
    ids=["chatter", "pathological"],
)
def test_the_model_reads_at_most_its_cap_of_a_64kb_tail(log: str) -> None:
    model = _recording_model()
    context = "the pod is being deleted " * 100
    message = "worker exited\n" * 200
    diagnose_worker(WorkerFacts(log_tail=log, context=context, message=message), model=model)
    (read,) = model.read
    assert len(read) <= MODEL_CAP
    assert read.endswith(log[-20:])
    assert read.startswith(context[:20])
    assert "worker exited" in read


def test_the_model_reads_a_report_as_training_did() -> None:
    entries = parse_corpus(CORPUS.read_text(encoding="utf-8").splitlines())
    model = _recording_model()
    asked = 0
    for entry in entries:
        diagnose_worker(facts_from_report(entry.text, entry.context), model=model)
        if model.read:
            assert model.read.pop() == model_text(entry), entry.id
            asked += 1
    assert asked > 0


def test_the_corpus_reports_fit_the_model_cap_whole() -> None:
    # Training sees each report whole; were one cut, its words past the cap would be lost.
    entries = parse_corpus(CORPUS.read_text(encoding="utf-8").splitlines())
    for entry in entries:
        assert model_text(entry) == f"{entry.context}\n\n{entry.text}", (
            f"{entry.id} is longer than what the model reads: revisit the caps in textmodel.py"
        )


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("short", 10, "short"),
        ("alpha beta gamma", 9, "gamma"),
        ("alpha beta gamma", 10, "beta gamma"),
        ("alpha beta\ngamma", 12, "beta\ngamma"),
        ("one-long-word", 4, "word"),
        ("unbroken", 4, "oken"),
    ],
    ids=["short", "mid-word", "at-space", "newline", "punctuation", "one-word"],
)
def test_a_bounded_tail_does_not_start_inside_a_word(text: str, limit: int, expected: str) -> None:
    assert bounded_tail(text, limit) == expected


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("short", 10, "short"),
        ("alpha beta gamma", 8, "alpha"),
        ("alpha beta gamma", 11, "alpha beta "),
        ("unbroken", 4, "unbr"),
    ],
    ids=["short", "mid-word", "at-space", "one-word"],
)
def test_a_bounded_head_does_not_end_inside_a_word(text: str, limit: int, expected: str) -> None:
    assert bounded_head(text, limit) == expected


def test_model_input_keeps_the_ends_that_matter() -> None:
    text = model_input("c" * 5_000, "m " * 5_000 + "last", "x " * 5_000 + "final")
    assert len(text) <= MODEL_CAP
    context, _, rest = text.partition("\n")
    assert context == "c" * textmodel.MAX_CONTEXT_CHARS
    assert "last" in rest and rest.endswith("final")


_WORD = compile_linear(r"[a-z_][a-z0-9_]+", where="test word pattern")


@pytest.mark.parametrize(
    "text",
    ["step num loss", "9abc _9 9_ a x86_64 a1b2", "caf\u00e9x ━━ foo—bar →baz", "", "12 34"],
    ids=["plain", "digits", "non-ascii", "empty", "numbers"],
)
def test_words_are_the_word_pattern_matches(text: str) -> None:
    assert words(text) == [m.group(0) for m in _WORD.finditer(text)]


@pytest.mark.parametrize(
    "text",
    ["", "no digits here", "step 12 loss 0.5 at 10.1.2.3", "\u00e9t\u00e9 42 \u2192 7", "99"],
    ids=["empty", "no-match", "many", "non-ascii", "whole"],
)
def test_replace_all_is_sub(text: str) -> None:
    number = compile_linear(r"\d+(?:\.\d+)*", where="test number pattern")
    assert replace_all(number, " num ", text) == number.sub(" num ", text)
