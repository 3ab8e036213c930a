"""Scoring the engine against a labelled corpus of real failure reports.

A corpus line is a JSON object with at least `text` (the error lines), `context` (what else
was known) and `label` (soft, medium, hard or fatal); `confidence` (high, medium, low) says
how settled the label is; `source` (`owner/repo#N` or `owner/repo path`) names where it was
posted. `cross_validate` scores the engine honestly: folds are whole source repositories,
and the text model is refit without the fold it scores. Pure: the CLI reads the file and
prints the `Report`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tpujob.diagnosis.engine import diagnose_worker
from tpujob.diagnosis.facts import REASON_OOM_KILLED, WorkerFacts
from tpujob.diagnosis.linear import compile_linear
from tpujob.diagnosis.model import Confidence, Diagnosis, FailureClass, FailureCode, Source
from tpujob.diagnosis.textmodel import TextModel, model_input
from tpujob.diagnosis.unknown import CHOSEN, UnknownPolicy

CLASSES = tuple(FailureClass)
_CONFIDENCE_RANK = {Confidence.LOW: 0, Confidence.MEDIUM: 1, Confidence.HIGH: 2}
_EXIT_CODE = compile_linear(r"\bexit(?:ed with)? code\W{0,3}(\d{1,3})\b", where="exit code")
DEFAULT_FOLDS = 5
# Longest corpus line accepted: a report is an excerpt, not a whole log.
MAX_LINE_CHARS = 1_000_000
Fitter = Callable[[Sequence[str], Sequence[FailureClass]], TextModel]


class CorpusError(ValueError):
    """A corpus line is not a usable entry."""


@dataclass(frozen=True)
class CorpusEntry:
    id: str
    text: str
    context: str
    label: FailureClass
    confidence: Confidence
    source: str = ""

    @property
    def repository(self) -> str:
        """`owner/repo` of the source: the unit of a cross-validation fold."""
        return self.source.strip().replace("#", " ").split(" ", 1)[0]


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
    unmatched: int = 0  # no rule, catalogue or exception entry named it (model or default)
    defaulted: int = 0  # nothing decided but the named default

    @property
    def n(self) -> int:
        return len(self.scored)

    @property
    def retryable(self) -> int:
        return sum(s.entry.label is not FailureClass.FATAL for s in self.scored)

    @property
    def unknown_rate(self) -> float:
        """Share of reports no mechanism named (the text model or the default graded)."""
        return self.unmatched / self.n if self.n else 0.0

    @property
    def retryable_failed_share(self) -> float:
        """Share of retryable reports graded fatal: runs that would be wrongly ended."""
        return self.retryable_failed / self.retryable if self.retryable else 0.0

    @property
    def summary_line(self) -> str:
        return (
            f"accuracy={self.accuracy:.3f} n={self.n}"
            f" fatal_retried={self.fatal_retried} retryable_failed={self.retryable_failed}"
            f" retryable_failed_share={self.retryable_failed_share:.3f}"
            f" unknown_rate={self.unknown_rate:.3f}"
            f" default_rate={self.defaulted / self.n if self.n else 0.0:.3f}"
        )


def parse_corpus(lines: Iterable[str]) -> list[CorpusEntry]:
    """Parse JSON lines into entries; a malformed line is refused with its line number."""
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_CHARS:
            raise CorpusError(f"line {number}: longer than {MAX_LINE_CHARS} characters")
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise CorpusError(f"line {number}: not a JSON object")
            entries.append(
                CorpusEntry(
                    id=str(data.get("id", number)),
                    text=str(data["text"]),
                    context=str(data.get("context", "")),
                    label=FailureClass(data["label"]),
                    confidence=Confidence(data.get("confidence", "high")),
                    source=str(data.get("source", "")),
                )
            )
        except CorpusError:
            raise
        except KeyError as error:
            raise CorpusError(f"line {number}: missing key {error}") from error
        except (ValueError, TypeError) as error:
            raise CorpusError(f"line {number}: {error}") from error
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
        unmatched=sum(s.diagnosis.code is FailureCode.UNKNOWN for s in scored),
        defaulted=sum(
            any(e.source is Source.DEFAULT for e in s.diagnosis.evidence) for s in scored
        ),
    )


def _kept(entries: Sequence[CorpusEntry], min_confidence: Confidence) -> list[CorpusEntry]:
    floor = _CONFIDENCE_RANK[min_confidence]
    return [e for e in entries if _CONFIDENCE_RANK[e.confidence] >= floor]


def diagnose_entry(
    entry: CorpusEntry,
    model: TextModel | Literal["packaged"] | None = "packaged",
    unknown: UnknownPolicy = CHOSEN,
) -> Diagnosis:
    facts = facts_from_report(entry.text, entry.context)
    return diagnose_worker(facts, model=model, unknown=unknown)


def evaluate(
    entries: Sequence[CorpusEntry], *, min_confidence: Confidence = Confidence.LOW
) -> Report:
    """Diagnose every entry at or above `min_confidence` with the packaged engine; score."""
    return score([Scored(e, diagnose_entry(e)) for e in _kept(entries, min_confidence)])


def folds_by_repository(entries: Sequence[CorpusEntry], k: int) -> list[set[str]]:
    """Split the repositories into `k` folds of similar entry counts, deterministically.

    Largest repository first (ties by a hash of its name), each into the fold that holds the
    fewest entries so far.
    """
    sizes: dict[str, int] = {}
    for entry in entries:
        sizes[entry.repository] = sizes.get(entry.repository, 0) + 1
    order = sorted(sizes, key=lambda r: (-sizes[r], hashlib.sha256(r.encode()).hexdigest()))
    folds: list[set[str]] = [set() for _ in range(min(k, len(order)))]
    loads = [0] * len(folds)
    for repo in order:
        target = loads.index(min(loads))
        folds[target].add(repo)
        loads[target] += sizes[repo]
    return folds


def cross_validate(
    entries: Sequence[CorpusEntry],
    fit: Fitter,
    *,
    folds: int = DEFAULT_FOLDS,
    min_confidence: Confidence = Confidence.LOW,
    unknown: UnknownPolicy = CHOSEN,
) -> Report:
    """Grouped cross-validation: each fold's entries are diagnosed by a model fit without it.

    The model is fit on every entry outside the fold (any confidence); the entries scored
    are the fold's at or above `min_confidence`. The rules are not refit: they are fixed
    text, which the set-aside corpus measures instead.
    """
    scored: list[Scored] = []
    for fold in folds_by_repository(entries, folds):
        train = [e for e in entries if e.repository not in fold]
        model = fit([model_text(e) for e in train], [e.label for e in train])
        held = [e for e in _kept(entries, min_confidence) if e.repository in fold]
        scored.extend(Scored(e, diagnose_entry(e, model, unknown)) for e in held)
    order = {e.id: i for i, e in enumerate(entries)}
    return score(sorted(scored, key=lambda s: order[s.entry.id]))


def model_text(entry: CorpusEntry) -> str:
    """What the text model reads of a report (the same fields the engine gives it)."""
    return model_input(entry.context, "", entry.text)
