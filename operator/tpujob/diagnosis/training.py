"""Training of the text model: deterministic full-batch gradient descent in numpy.

`python -m tpujob.diagnosis.training CORPUS.jsonl OUT.json` (`make diagnosis-model`) fits
the model on every entry of a corpus and writes the weights; the cross-validation in
`tpujob diagnose --eval --cv` calls `fit` once per fold. No randomness (zero start, fixed
step count, features in sorted order), so the same corpus always gives the same weights,
which a unit test checks against the committed file. numpy is needed here only, never at
inference.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tpujob.diagnosis.model import FailureClass
from tpujob.diagnosis.textmodel import TextModel, features

MIN_DOCUMENTS = 2  # a feature seen in one report only is that report's phrasing
MAX_FEATURES = 2_000
L2 = 1e-3
STEPS = 400
LEARNING_RATE = 2.0
DECIMALS = 4


def fit(texts: Sequence[str], labels: Sequence[FailureClass]) -> TextModel:
    """Fit a class-balanced multinomial logistic regression on the texts."""
    classes = tuple(FailureClass)
    present = [features(t) for t in texts]
    counts = Counter(f for doc in present for f in doc)
    kept = sorted(
        (f for f, n in counts.items() if n >= MIN_DOCUMENTS), key=lambda f: (-counts[f], f)
    )[:MAX_FEATURES]
    kept.sort()
    index = {f: i for i, f in enumerate(kept)}
    x = np.zeros((len(texts), len(kept)))
    for row, doc in enumerate(present):
        columns = [index[f] for f in doc if f in index]
        if columns:
            x[row, columns] = 1.0 / np.sqrt(len(columns))
    y = np.zeros((len(texts), len(classes)))
    for row, label in enumerate(labels):
        y[row, classes.index(label)] = 1.0
    # Balanced: every class weighs the same in the loss, whatever its count.
    per_class = y.sum(axis=0)
    sample_weight = (y / np.maximum(per_class, 1.0)).sum(axis=1) * len(texts) / len(classes)
    w = np.zeros((len(kept), len(classes)))
    b = np.zeros(len(classes))
    for _ in range(STEPS):
        scores = x @ w + b
        scores -= scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=1, keepdims=True)
        error = (p - y) * sample_weight[:, None] / len(texts)
        w -= LEARNING_RATE * (x.T @ error + L2 * w)
        b -= LEARNING_RATE * error.sum(axis=0)
    return TextModel(
        classes,
        index,
        tuple(tuple(round(float(v), DECIMALS) for v in w[:, k]) for k in range(len(classes))),
        tuple(round(float(v), DECIMALS) for v in b),
    )


def main(argv: Sequence[str]) -> int:
    from tpujob.diagnosis.evaluate import model_text, parse_corpus

    corpus, out = Path(argv[0]), Path(argv[1])
    with corpus.open(encoding="utf-8") as lines:
        entries = parse_corpus(lines)
    model = fit([model_text(e) for e in entries], [e.label for e in entries])
    out.write_text(json.dumps(model.as_dict(), separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{out}: {len(model.index)} features x {len(model.classes)} classes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
