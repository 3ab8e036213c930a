"""The learned fallback: a small linear text model for failures no rule names.

Features are word unigrams and bigrams plus character 3-5-grams inside words, taken from
text whose volatile parts are replaced by placeholders (numbers, hex ids, paths, IPs, host
names, URLs), so the model learns mechanisms' words rather than one report's addresses. The
weights are a committed JSON file (`textmodel.json`, written by `make diagnosis-model`);
inference is plain Python: a sum of the present features' weights per class, then a softmax,
whose top probability is reported as the confidence. Pure.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from tpujob.diagnosis.linear import compile_linear
from tpujob.diagnosis.model import FailureClass

WEIGHTS_RESOURCE = "textmodel.json"
FORMAT_VERSION = 1
# The model reads the end of the log (where the failure is) plus the context.
MAX_TEXT_CHARS = 6_000

# Order matters: URLs before paths and hosts, IPs before numbers.
_PLACEHOLDERS = tuple(
    (compile_linear(pattern, where=f"built-in normaliser {name}"), f" {name} ")
    for name, pattern in (
        ("url", r"\b[a-z][a-z0-9+.-]*://\S+"),
        (
            "ipaddr",
            r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\b[0-9a-f]{1,4}(?::[0-9a-f]{0,4}){4,7}\b",
        ),
        (
            "hexid",
            r"\b0x[0-9a-f]+\b|\b[0-9a-f]*\d[0-9a-f]*[a-f][0-9a-f]*\b|\b[0-9a-f]*[a-f][0-9a-f]*\d[0-9a-f]*\b",
        ),
        ("path", r"(?:[\w.-]*/[\w.@+=-]+){2,}/?"),
        ("host", r"\b[a-z0-9-]+(?:\.[a-z0-9-]+){2,}\b"),
        ("num", r"\d+(?:\.\d+)*"),
    )
)
_WORD = compile_linear(r"[a-z_][a-z0-9_]+", where="built-in word pattern")


def normalise(text: str) -> str:
    """Lower-case text with volatile tokens replaced by placeholders."""
    out = text[-MAX_TEXT_CHARS:].lower()
    for regex, placeholder in _PLACEHOLDERS:
        out = regex.sub(placeholder, out)
    return out


def features(text: str) -> set[str]:
    """The feature names present in `text` (binary: presence, not counts)."""
    words = [m.group(0) for m in _WORD.finditer(normalise(text))]
    found = {f"w:{w}" for w in words}
    found.update(f"b:{a} {b}" for a, b in itertools.pairwise(words))
    for word in set(words):
        padded = f" {word} "
        for n in (3, 4, 5):
            found.update(f"c:{padded[i : i + n]}" for i in range(len(padded) - n + 1))
    return found


@dataclass(frozen=True)
class Prediction:
    failure_class: FailureClass
    probability: float
    probabilities: Mapping[FailureClass, float]


@dataclass(frozen=True)
class TextModel:
    """A multinomial logistic regression over binary, L2-normalised features."""

    classes: tuple[FailureClass, ...]
    index: Mapping[str, int]  # feature name -> column
    weights: tuple[tuple[float, ...], ...]  # one row per class
    bias: tuple[float, ...]

    def predict(self, text: str) -> Prediction:
        columns = [self.index[f] for f in features(text) if f in self.index]
        scale = 1.0 / math.sqrt(len(columns)) if columns else 0.0
        scores = [
            b + scale * sum(row[c] for c in columns)
            for row, b in zip(self.weights, self.bias, strict=True)
        ]
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        total = sum(exps)
        probabilities = {c: e / total for c, e in zip(self.classes, exps, strict=True)}
        best = max(self.classes, key=lambda c: probabilities[c])
        return Prediction(best, probabilities[best], probabilities)

    def as_dict(self) -> dict[str, Any]:
        names = sorted(self.index, key=self.index.__getitem__)
        return {
            "version": FORMAT_VERSION,
            "classes": [str(c) for c in self.classes],
            "features": names,
            "weights": [list(row) for row in self.weights],
            "bias": list(self.bias),
        }


class ModelFormatError(ValueError):
    """The weights file is not a model this code can read."""


def model_from_dict(data: Mapping[str, Any]) -> TextModel:
    try:
        if data["version"] != FORMAT_VERSION:
            raise ModelFormatError(f"weights format {data['version']}, expected {FORMAT_VERSION}")
        classes = tuple(FailureClass(c) for c in data["classes"])
        names: Sequence[str] = data["features"]
        weights = tuple(tuple(float(w) for w in row) for row in data["weights"])
        bias = tuple(float(b) for b in data["bias"])
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, ModelFormatError):
            raise
        raise ModelFormatError(f"malformed weights: {error!r}") from error
    if len(weights) != len(classes) or any(len(row) != len(names) for row in weights):
        raise ModelFormatError("weights do not match the classes and features")
    return TextModel(classes, {n: i for i, n in enumerate(names)}, weights, bias)


@functools.cache
def packaged_model() -> TextModel:
    """The committed weights, read once (the model is immutable, so sharing is safe)."""
    text = resources.files("tpujob.diagnosis").joinpath(WEIGHTS_RESOURCE).read_text("utf-8")
    return model_from_dict(json.loads(text))
