"""The bar on real failure reports: accuracy and the two costly kinds of error."""

from __future__ import annotations

import json
from pathlib import Path

from tpujob.diagnosis.evaluate import evaluate, parse_corpus
from tpujob.diagnosis.model import Confidence

CORPUS = Path(__file__).parents[2] / "data" / "corpus" / "errors.jsonl"
# Fit on everything (the packaged model saw these reports): a floor against regressions. The
# honest figure is the grouped cross-validation (`tpujob diagnose --eval ... --cv`). The
# development set now holds 133 reports no rule was written from (the first set-aside and
# most of the second file), so the floor is lower than it was on the first 185.
# Wrongly failing a retryable run is the unbounded cost (`unknown.py`): at most 5% of the
# retryable reports. Retrying a fatal one is bounded by the job's memory, so its bar is looser.
MIN_ACCURACY = 0.78
MAX_RETRYABLE_FAILED_SHARE = 0.05
MAX_FATAL_RETRIED_SHARE = 0.10


def test_corpus_entries_keep_their_sources() -> None:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    assert lines
    assert all(json.loads(line)["source"] for line in lines)


def test_engine_meets_the_bar_on_high_and_medium_confidence_reports() -> None:
    entries = parse_corpus(CORPUS.read_text(encoding="utf-8").splitlines())
    report = evaluate(entries, min_confidence=Confidence.MEDIUM)
    misses = [(s.entry.id, s.entry.label, s.diagnosis.rule) for s in report.scored if not s.correct]
    assert report.n == sum(e.confidence is not Confidence.LOW for e in entries)
    assert report.accuracy >= MIN_ACCURACY, (report.summary_line, misses)
    assert report.retryable_failed_share <= MAX_RETRYABLE_FAILED_SHARE, report.summary_line
    assert report.fatal_retried <= MAX_FATAL_RETRIED_SHARE * report.n, (report.summary_line, misses)
