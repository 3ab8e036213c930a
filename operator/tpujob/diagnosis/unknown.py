"""Unknown is a decision: what a failure that no rule names gets, and why.

The costs are not symmetric. Retrying a deterministic (fatal) failure once costs one
attempt's start-up and a backoff, bounded because the job's memory (`memory.py`) grades the
same signature when it comes back: on the same node it is the node (hard), on other nodes it
is the program (fatal, with the evidence). Failing a transient failure as fatal kills a
healthy run and needs a person to resubmit it: unbounded cost. Grading an unknown failure
hard blames and taints a node on no node evidence at all, which issue-level policy forbids.

So, in order:
1. The learned text model grades it when its top probability reaches `MODEL_FLOOR`; its
   probability is the confidence (low below `MODEL_CONFIDENT`, medium above, never high: it
   is a guess from words, not a fact). A model's hard grade moves the slice but is not node
   evidence: the operator must not taint a node on it alone.
2. Otherwise the rule table's named default: medium, UNKNOWN: restart once from the last
   checkpoint after a backoff. A repeat is then decided by where it recurs, and
   `DEFAULT_UNKNOWN_RETRY_LIMIT` unknowns in a row give up.
"""

from __future__ import annotations

from tpujob.diagnosis.model import DEFAULT_ACTIONS, Confidence, FailureCode
from tpujob.diagnosis.rules import Verdict
from tpujob.diagnosis.textmodel import Prediction

MODEL_FLOOR = 0.40  # below it four classes are close to a coin toss: take the default
MODEL_CONFIDENT = 0.70


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
