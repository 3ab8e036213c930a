"""Unknown is a decision: what a failure that no rule or catalogue names gets, and why.

The costs are not symmetric, and they are what the choice is measured by:

- a job wrongly failed (a retryable failure graded fatal) kills a healthy run and needs a
  person to notice and resubmit it: unbounded, `COST_WRONGLY_FAILED`;
- a broken node reused (a hard failure graded soft or medium) costs another attempt on the
  same broken node before the job's memory (`memory.py`) sees it recur there and moves the
  slice: `COST_BROKEN_NODE_REUSED`;
- a restart wasted (a fatal failure retried) costs one attempt's start-up and a backoff,
  bounded because the memory grades the same signature fatal when it comes back on other
  nodes: `COST_RESTART_WASTED`;
- a needless move (a soft or medium failure graded hard) reschedules the slice and spends
  one of the job's `maxFailedNodes`: `COST_NEEDLESS_MOVE`;
- soft for medium or the other way costs a backoff more or less: `COST_BACKOFF`.

An unknown failure is never graded hard by the default: that would blame a node on no node
evidence at all. The text model may say hard (it moves the slice, but it is not node
evidence: the operator never taints on it).

The choice, measured by `tpujob diagnose --eval tests/data/corpus/errors.jsonl --cv
--unknown-policies` (grouped by repository, 318 development reports, the weights above;
cost summed over all reports, only those no mechanism named differ between policies):

    policy                   accuracy  wrongly failed  restarts wasted  nodes reused  cost
    default-only             0.723      9              30               23            196.6
    model-0.40 (before)      0.789     15              18               16            222.8
    model-0.25               0.799     16              14               16            229.6
    model-0.25-fatal-0.60    0.783      9              23               17            172.0
    model-0.40-fatal-0.50    0.783     11              22               17            190.0
    model-0.40-fatal-0.60    0.783      9              23               17            171.2  chosen
    model-0.40-fatal-0.70    0.767      9              28               17            176.2
    model-0.40-never-fatal   0.761      9              30               17            178.2
    model-0.55-fatal-0.60    0.767      9              23               20            179.8

The most accurate policy is not the cheapest: taking every guess of the model (0.25) fails
16 retryable runs where the chosen one fails 9 (4.7% of 192 retryable reports) for 0.016 of
accuracy.

So: the model grades an unknown failure when its top probability reaches `MODEL_FLOOR`, but a
fatal grade needs `FATAL_FLOOR`, since failing a run is the one unbounded cost; below it the
named default answers (medium, UNKNOWN: restart once from the last checkpoint after a
backoff; the memory decides a repeat, and `DEFAULT_UNKNOWN_RETRY_LIMIT` unknowns in a row give
up). The model's probability is the confidence: low below `MODEL_CONFIDENT`, medium above,
never high (a guess from words, not a fact). A low-confidence guess of fatal or hard is still
not acted on as graded: the operator restarts once, as for an unknown failure, and lets a
repeat decide (`weigh_model_guess`, applied by the planner's regrading and by `tpujob
diagnose`, so that both say the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tpujob.diagnosis.escalation import escalate
from tpujob.diagnosis.model import (
    DEFAULT_ACTIONS,
    Confidence,
    Diagnosis,
    Evidence,
    FailureClass,
    FailureCode,
    Source,
)
from tpujob.diagnosis.rules import Verdict
from tpujob.diagnosis.textmodel import Prediction

MODEL_FLOOR = 0.40  # below it four classes are close to a coin toss: take the default
FATAL_FLOOR = 0.60  # a fatal guess ends a run: it needs to be a sure one
MODEL_CONFIDENT = 0.70

COST_WRONGLY_FAILED = 10.0
COST_BROKEN_NODE_REUSED = 3.0
COST_RESTART_WASTED = 1.0
COST_NEEDLESS_MOVE = 1.0
COST_BACKOFF = 0.2


@dataclass(frozen=True)
class UnknownPolicy:
    """When the text model's guess is taken instead of the default."""

    name: str
    floor: float = MODEL_FLOOR
    fatal_floor: float = FATAL_FLOOR

    def accepts(self, prediction: Prediction) -> bool:
        needed = self.fatal_floor if prediction.failure_class is FailureClass.FATAL else self.floor
        return prediction.probability >= needed


NEVER = 1.01  # above any probability
CHOSEN = UnknownPolicy("model-0.40-fatal-0.60")
CANDIDATES = (
    UnknownPolicy("default-only", floor=NEVER, fatal_floor=NEVER),
    UnknownPolicy("model-0.40 (before)", floor=0.40, fatal_floor=0.40),
    UnknownPolicy("model-0.25", floor=0.25, fatal_floor=0.25),
    UnknownPolicy("model-0.25-fatal-0.60", floor=0.25, fatal_floor=0.60),
    UnknownPolicy("model-0.40-fatal-0.50", floor=0.40, fatal_floor=0.50),
    CHOSEN,
    UnknownPolicy("model-0.40-fatal-0.70", floor=0.40, fatal_floor=0.70),
    UnknownPolicy("model-0.40-never-fatal", floor=0.40, fatal_floor=NEVER),
    UnknownPolicy("model-0.55-fatal-0.60", floor=0.55, fatal_floor=0.60),
)


def cost(expected: FailureClass, graded: FailureClass) -> float:
    """What grading a failure of class `expected` as `graded` costs a user (the weights above)."""
    if expected is graded:
        return 0.0
    if graded is FailureClass.FATAL:
        return COST_WRONGLY_FAILED
    if expected is FailureClass.HARD:
        return COST_BROKEN_NODE_REUSED
    if expected is FailureClass.FATAL:
        return COST_RESTART_WASTED
    if graded is FailureClass.HARD:
        return COST_NEEDLESS_MOVE
    return COST_BACKOFF


def total_cost(confusion: Mapping[FailureClass, Mapping[FailureClass, int]]) -> float:
    """The summed cost of a confusion matrix (expected -> graded -> count)."""
    return sum(
        cost(expected, graded) * count
        for expected, row in confusion.items()
        for graded, count in row.items()
    )


def model_verdict(prediction: Prediction) -> Verdict:
    """The verdict of the text model's prediction (code UNKNOWN: no mechanism was named)."""
    cls = prediction.failure_class
    confidence = Confidence.MEDIUM if prediction.probability >= MODEL_CONFIDENT else Confidence.LOW
    return Verdict(
        failure_class=cls,
        code=FailureCode.UNKNOWN,
        confidence=confidence,
        summary=(
            f"no rule names this failure; the text model grades it {cls}"
            f" (probability {prediction.probability:.2f})"
        ),
        action=DEFAULT_ACTIONS[cls],
    )


def weigh_model_guess(d: Diagnosis) -> Diagnosis:
    """A low-confidence model verdict of fatal or hard becomes the unknown default (medium)."""
    if (
        d.probability is None
        or d.confidence is not Confidence.LOW
        or d.failure_class not in (FailureClass.FATAL, FailureClass.HARD)
    ):
        return d
    return escalate(
        d,
        to=FailureClass.MEDIUM,
        note="; too weak a guess to act on: restarted once, a repeat decides",
        action=DEFAULT_ACTIONS[FailureClass.MEDIUM],
        evidence=Evidence(Source.MODEL, f"model probability {d.probability:.2f}"),
    )
