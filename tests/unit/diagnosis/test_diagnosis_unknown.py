"""Unknown failures: the costs that decide the policy, and the policy the engine applies."""

from __future__ import annotations

import math

import pytest

from tpujob.diagnosis import FailureClass, WorkerFacts, diagnose_worker
from tpujob.diagnosis.textmodel import Prediction, TextModel
from tpujob.diagnosis.unknown import CANDIDATES, CHOSEN, UnknownPolicy, cost, total_cost

S, M, H, F = FailureClass.SOFT, FailureClass.MEDIUM, FailureClass.HARD, FailureClass.FATAL


def test_wrongly_failing_a_run_costs_more_than_any_other_mistake() -> None:
    others = [cost(e, g) for e in FailureClass for g in FailureClass if g is not F and e is not g]
    assert all(cost(e, F) > max(others) for e in (S, M, H))


@pytest.mark.parametrize(
    ("expected", "graded", "cheaper_than"),
    [
        (F, M, (H, M)),  # a fatal retried is cheaper than a broken node reused
        (S, M, (S, H)),  # a backoff more is cheaper than a needless move
        (M, H, (H, S)),  # a needless move is cheaper than a broken node reused
    ],
    ids=["restart-wasted-vs-node-reused", "backoff-vs-move", "move-vs-node-reused"],
)
def test_bounded_mistakes_are_ordered_by_what_they_cost(
    expected: FailureClass, graded: FailureClass, cheaper_than: tuple[FailureClass, FailureClass]
) -> None:
    assert cost(expected, graded) < cost(*cheaper_than)


def test_total_cost_sums_each_cell_by_its_weight() -> None:
    confusion = {e: {g: 0 for g in FailureClass} for e in FailureClass}
    confusion[S][F] = 2
    confusion[H][M] = 1
    assert total_cost(confusion) == 2 * cost(S, F) + cost(H, M)


def _model(probabilities: dict[FailureClass, float]) -> TextModel:
    """A model that always predicts the given distribution (bias only, no features)."""
    classes = tuple(FailureClass)
    return TextModel(
        classes, {}, tuple(() for _ in classes), tuple(math.log(probabilities[c]) for c in classes)
    )


@pytest.mark.parametrize(
    ("probabilities", "expected_rule", "expected_class"),
    [
        ({S: 0.1, M: 0.1, H: 0.1, F: 0.7}, "text-model", F),
        ({S: 0.2, M: 0.1, H: 0.2, F: 0.5}, "unknown", M),
        ({S: 0.5, M: 0.2, H: 0.1, F: 0.2}, "text-model", S),
        ({S: 0.3, M: 0.3, H: 0.1, F: 0.3}, "unknown", M),
    ],
    ids=["sure-fatal-taken", "unsure-fatal-defaults", "soft-guess-taken", "coin-toss-defaults"],
)
def test_unmatched_failure_takes_the_model_guess_only_as_the_policy_allows(
    probabilities: dict[FailureClass, float], expected_rule: str, expected_class: FailureClass
) -> None:
    facts = WorkerFacts(log_tail="zzz the run stopped qqq")
    diagnosis = diagnose_worker(facts, model=_model(probabilities))
    assert (diagnosis.rule, diagnosis.failure_class) == (expected_rule, expected_class)


def test_a_fatal_guess_needs_more_than_a_retrying_one_under_the_chosen_policy() -> None:
    guess = {c: 0.0 for c in FailureClass}
    at = (CHOSEN.floor + CHOSEN.fatal_floor) / 2
    assert CHOSEN.accepts(Prediction(S, at, guess))
    assert not CHOSEN.accepts(Prediction(F, at, guess))


def test_the_chosen_policy_is_one_of_the_measured_candidates() -> None:
    assert CHOSEN in CANDIDATES
    assert len({p.name for p in CANDIDATES}) == len(CANDIDATES)
    assert UnknownPolicy("x", floor=1.01, fatal_floor=1.01).accepts(Prediction(F, 1.0, {})) is False
