"""Why a failure got its grade: which layer and entry decided, and what came second.

`tpujob diagnose --explain` prints this. A catalogue entry is shown with its mechanism, its
documented meaning, why it has its class and where that is documented; a site rule with who
set it, when and why; the text model with the features that pulled it towards its class.
What came second is the strongest later verdict on the same facts that says another class
(the alternative the layers' order overruled), or, when every later one agrees, the next
one; the named default is no verdict and never comes second. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tpujob.diagnosis import facts as f
from tpujob.diagnosis.catalogue import Entry, default_lookup, default_table
from tpujob.diagnosis.engine import Hit, Layer, ranked_hits
from tpujob.diagnosis.model import FailureClass, FailureCode
from tpujob.diagnosis.rules import RuleTable, UserRule
from tpujob.diagnosis.site import SiteRule
from tpujob.diagnosis.textmodel import TextModel, model_input, packaged_model
from tpujob.diagnosis.texts import admitted, texts_of

TOP_FEATURES = 8


@dataclass(frozen=True)
class Candidate:
    """One layer's verdict, with what a person needs to judge it."""

    layer: Layer
    rule: str
    failure_class: FailureClass
    code: FailureCode
    evidence: tuple[str, ...]
    entry: Entry | None = None
    features: tuple[tuple[str, float], ...] = ()

    def lines(self) -> list[str]:
        out = [f"{self.layer} {self.rule}: {self.failure_class} {self.code}"]
        if self.entry is not None:
            out += [
                f"  mechanism: {self.entry.mechanism}",
                f"  documented meaning: {self.entry.meaning}",
                f"  why {self.failure_class}: {self.entry.why}",
                f"  documented: {self.entry.documented}",
            ]
        out += [f"  evidence: {item}" for item in self.evidence]
        if self.features:
            pulls = ", ".join(f"{name} ({weight:+.2f})" for name, weight in self.features)
            out.append(f"  features: {pulls}")
        return out


@dataclass(frozen=True)
class Explanation:
    decided: Candidate
    second: Candidate | None

    @property
    def contested(self) -> bool:
        """Whether the runner-up says another class."""
        return self.second is not None and self.second.failure_class != self.decided.failure_class

    def lines(self) -> list[str]:
        out = ["decided by:", *("  " + line for line in self.decided.lines())]
        if self.second is None:
            return [*out, "second: nothing else named this failure"]
        verdict = "another class" if self.contested else "the same class"
        out.append(f"second ({verdict}):")
        return out + ["  " + line for line in self.second.lines()]


def _candidate(hit: Hit, model: TextModel | None, text: str) -> Candidate:
    features: tuple[tuple[str, float], ...] = ()
    if hit.layer is Layer.MODEL and model is not None:
        pulls = model.contributions(text, hit.verdict.failure_class)
        features = tuple(pulls[:TOP_FEATURES])
    return Candidate(
        layer=hit.layer,
        rule=hit.rule,
        failure_class=hit.verdict.failure_class,
        code=hit.verdict.code,
        evidence=tuple(str(e) for e in hit.evidence),
        entry=default_lookup().by_key.get(hit.rule),
        features=features,
    )


def explain_worker(
    worker: f.WorkerFacts,
    *,
    user_rules: Sequence[UserRule] = (),
    site_rules: Sequence[SiteRule] = (),
    table: RuleTable | None = None,
    model: TextModel | Literal["packaged"] | None = "packaged",
) -> Explanation:
    """The verdict `diagnose_worker` would give the worker, and the one that came second."""
    worker = admitted(worker)
    text_model = packaged_model() if model == "packaged" else model
    hits = ranked_hits(
        worker, user_rules=user_rules, site_rules=site_rules, table=table, model=text_model
    )
    first = next(hits)
    later = [hit for hit in hits if hit.layer is not Layer.DEFAULT]
    other = next((h for h in later if h.verdict.failure_class != first.verdict.failure_class), None)
    runner_up = other or (later[0] if later else None)
    texts = texts_of(worker, table if table is not None else default_table())
    text = model_input(texts.context, texts.message, texts.log)
    second = _candidate(runner_up, text_model, text) if runner_up else None
    return Explanation(_candidate(first, text_model, text), second)
