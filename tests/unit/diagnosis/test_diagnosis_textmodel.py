"""The learned fallback: deterministic training, committed weights, probability as confidence."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from tpujob.diagnosis import WorkerFacts, diagnose_worker
from tpujob.diagnosis.evaluate import model_text, parse_corpus
from tpujob.diagnosis.textmodel import ModelFormatError, model_from_dict, normalise, packaged_model

CORPUS = Path(__file__).parents[2] / "data" / "corpus" / "errors.jsonl"


def test_committed_weights_match_a_fresh_training() -> None:
    from tpujob.diagnosis.training import fit

    entries = parse_corpus(CORPUS.read_text(encoding="utf-8").splitlines())
    fresh = fit([model_text(e) for e in entries], [e.label for e in entries]).as_dict()
    committed = json.loads(
        resources.files("tpujob.diagnosis").joinpath("textmodel.json").read_text("utf-8")
    )
    assert fresh["features"] == committed["features"]
    assert fresh["classes"] == committed["classes"]
    for new_row, old_row in zip(fresh["weights"], committed["weights"], strict=True):
        assert new_row == pytest.approx(old_row, abs=2e-4)


@pytest.mark.parametrize(
    ("text", "placeholder", "gone"),
    [
        ("peer at 10.1.2.3:8470 closed", "ipaddr", "10.1.2.3"),
        ("reading /usr/lib/python3/site.py failed", "path", "site.py"),
        ("buffer 0xdeadbeef freed", "hexid", "deadbeef"),
        ("worker w-1.pool.example.internal lost", "host", "example"),
        ("step 12345 failed", "num", "12345"),
        ("see https://x.io/a?b=1 for details", "url", "x.io"),
    ],
    ids=["ip", "path", "hex", "host", "number", "url"],
)
def test_volatile_tokens_are_normalised(text: str, placeholder: str, gone: str) -> None:
    normalised = normalise(text)
    assert placeholder in normalised.split()
    assert gone not in normalised


def test_unmatched_failure_reports_the_model_probability_as_confidence() -> None:
    diagnosis = diagnose_worker(WorkerFacts(log_tail="training stopped; see attached graph"))
    if diagnosis.rule == "text-model":
        assert diagnosis.probability is not None and 0.0 < diagnosis.probability <= 1.0
        assert f"{diagnosis.probability:.2f}" in diagnosis.summary
    else:
        assert diagnosis.rule == "unknown" and diagnosis.probability is None


def test_weights_of_another_format_are_refused() -> None:
    data = packaged_model().as_dict() | {"version": 99}
    with pytest.raises(ModelFormatError):
        model_from_dict(data)
