"""Scoring the engine against a labelled corpus of real failure reports.

A corpus line is a JSON object with at least `text` (the error lines), `context` (what else
was known) and `label` (soft, medium, hard or fatal); `confidence` (high, medium, low) says
how settled the label is. Pure: the CLI reads the file and prints the `Report`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tpujob.diagnosis.engine import diagnose_worker
from tpujob.diagnosis.facts import REASON_OOM_KILLED, WorkerFacts
from tpujob.diagnosis.model import Confidence, Diagnosis, FailureClass

CLASSES = tuple(FailureClass)
_CONFIDENCE_RANK = {Confidence.LOW: 0, Confidence.MEDIUM: 1, Confidence.HIGH: 2}
_EXIT_CODE = re.compile(r"\bexit(?:ed with)? code\W{0,3}(\d{1,3})\b", re.IGNORECASE)


class CorpusError(ValueError):
    """A corpus line is not a usable entry."""


@dataclass(frozen=True)
class CorpusEntry:
    id: str
    text: str
    context: str
    label: FailureClass
    confidence: Confidence


@dataclass(frozen=True)
class Scored:
    entry: CorpusEntry
    diagnosis: Diagnosis

    @property
    def correct(self) -> bool:
        return self.diagnosis.failure_class is self.entry.label


@dataclass(frozen=True)
class ClassScore:
    failure_class: FailureClass
    precision: float
    recall: float
    support: int


@dataclass(frozen=True)
class Report:
    scored: tuple[Scored, ...]
    confusion: dict[FailureClass, dict[FailureClass, int]]  # expected -> predicted -> count
    per_class: tuple[ClassScore, ...]
    accuracy: float
    fatal_retried: int  # fatal reports given a retrying class
    retryable_failed: int  # retryable reports classified fatal

    @property
    def n(self) -> int:
        return len(self.scored)

    @property
    def summary_line(self) -> str:
        return (
            f"accuracy={self.accuracy:.3f} n={self.n}"
            f" fatal_retried={self.fatal_retried} retryable_failed={self.retryable_failed}"
        )


def parse_corpus(lines: Iterable[str]) -> list[CorpusEntry]:
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            entries.append(
                CorpusEntry(
                    id=str(data.get("id", number)),
                    text=str(data["text"]),
                    context=str(data.get("context", "")),
                    label=FailureClass(data["label"]),
                    confidence=Confidence(data.get("confidence", "high")),
                )
            )
        except (ValueError, KeyError, TypeError) as error:
            raise CorpusError(f"line {number}: {error!r}") from error
    return entries


def facts_from_report(text: str, context: str) -> WorkerFacts:
    """Worker facts from a written report: the text is the log, the context adds notes.

    An exit code or OOMKilled mentioned in the context is taken as the container status.
    """
    exit_match = _EXIT_CODE.search(context)
    return WorkerFacts(
        log_tail=text,
        context=context,
        exit_code=int(exit_match.group(1)) if exit_match else None,
        reason=REASON_OOM_KILLED if REASON_OOM_KILLED.lower() in context.lower() else None,
    )


def score(scored: Sequence[Scored]) -> Report:
    confusion = {e: {p: 0 for p in CLASSES} for e in CLASSES}
    for item in scored:
        confusion[item.entry.label][item.diagnosis.failure_class] += 1
    per_class = []
    for cls in CLASSES:
        hits = confusion[cls][cls]
        predicted = sum(confusion[e][cls] for e in CLASSES)
        support = sum(confusion[cls].values())
        per_class.append(
            ClassScore(
                cls,
                precision=hits / predicted if predicted else 0.0,
                recall=hits / support if support else 0.0,
                support=support,
            )
        )
    correct = sum(confusion[c][c] for c in CLASSES)
    fatal = FailureClass.FATAL
    return Report(
        scored=tuple(scored),
        confusion=confusion,
        per_class=tuple(per_class),
        accuracy=correct / len(scored) if scored else 0.0,
        fatal_retried=sum(confusion[fatal][p] for p in CLASSES if p is not fatal),
        retryable_failed=sum(confusion[e][fatal] for e in CLASSES if e is not fatal),
    )


def evaluate(
    entries: Sequence[CorpusEntry], *, min_confidence: Confidence = Confidence.LOW
) -> Report:
    """Diagnose every entry at or above `min_confidence` and score the classes."""
    floor = _CONFIDENCE_RANK[min_confidence]
    kept = [e for e in entries if _CONFIDENCE_RANK[e.confidence] >= floor]
    return score([Scored(e, diagnose_worker(facts_from_report(e.text, e.context))) for e in kept])
