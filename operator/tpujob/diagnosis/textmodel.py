"""The learned fallback: a small linear text model for failures no rule names.

Features are word unigrams and bigrams plus character 3-5-grams inside words, taken from
text whose volatile parts are replaced by placeholders (numbers, hex ids, paths, IPs, host
names, URLs), so the model learns mechanisms' words rather than one report's addresses. The
weights are a committed JSON file (`textmodel.json`, written by `make diagnosis-model`);
inference is plain Python: a sum of the present features' weights per class, then a softmax,
whose top probability is reported as the confidence. Pure.

What the model reads is bounded (`model_input`): the head of the context, the tail of the
message and the tail of the log, 4 KB at most whatever the size of the log. Training
reads its reports through the same function, so both see text of the same shape: a report
is an excerpt of a few hundred characters, and a model fed 6 KB of step chatter around the
same lines both dilutes their features and spends most of a diagnosis normalising chatter.
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

from tpujob.diagnosis.linear import compile_linear, replace_all
from tpujob.diagnosis.model import FailureClass

WEIGHTS_RESOURCE = "textmodel.json"
FORMAT_VERSION = 1
# What the model reads of each field. The context is the operator's own short notes, most
# telling first; a message and a log end where the failure is.
MAX_CONTEXT_CHARS = 1_000
MAX_MESSAGE_CHARS = 1_000
MAX_LOG_CHARS = 2_000
# A bound for any caller that hands `features` text not cut by `model_input`.
MAX_TEXT_CHARS = MAX_CONTEXT_CHARS + MAX_MESSAGE_CHARS + MAX_LOG_CHARS + 2

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
# Words are runs of [a-z0-9_] that start with a letter or underscore and are 2+ long. They
# are cut with str methods, not a regex: one match object per word cost more than all the
# rest of the model's work. Anything else (punctuation, non-ASCII) separates words.
_WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_")
_SEPARATE = bytes(b if b in _WORD_BYTES else 0x20 for b in range(256))
_DIGITS = "0123456789"


def bounded_head(text: str, limit: int) -> str:
    """The start of `text`, at most `limit` characters, not ending inside a word.

    A word the cut splits would become a feature of its own, so the head ends before it.
    """
    if len(text) <= limit:
        return text
    head = text[:limit]
    if head[-1].isspace() or text[limit].isspace():
        return head
    parts = head.rsplit(maxsplit=1)
    return parts[0] if len(parts) == 2 else head


def bounded_tail(text: str, limit: int) -> str:
    """The end of `text`, at most `limit` characters, not starting inside a word."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    if tail[0].isspace() or text[-limit - 1].isspace():
        return tail
    parts = tail.split(maxsplit=1)
    return parts[1] if len(parts) == 2 else tail


def model_input(context: str, message: str, log: str) -> str:
    """The bounded text the model reads of a failure (in training and in a diagnosis)."""
    return "\n".join(
        (
            bounded_head(context, MAX_CONTEXT_CHARS),
            bounded_tail(message, MAX_MESSAGE_CHARS),
            bounded_tail(log, MAX_LOG_CHARS),
        )
    )


def words(normalised: str) -> list[str]:
    """The words of normalised text, in order."""
    runs = normalised.encode("ascii", "replace").translate(_SEPARATE).split()
    found = (run.decode("ascii").lstrip(_DIGITS) for run in runs)
    return [word for word in found if len(word) >= 2]


def normalise(text: str) -> str:
    """Lower-case text with volatile tokens replaced by placeholders."""
    out = text[-MAX_TEXT_CHARS:].lower()
    for regex, placeholder in _PLACEHOLDERS:
        out = replace_all(regex, placeholder, out)
    return out


def features(text: str) -> set[str]:
    """The feature names present in `text` (binary: presence, not counts)."""
    tokens = words(normalise(text))
    found = {f"w:{w}" for w in tokens}
    found.update(f"b:{a} {b}" for a, b in itertools.pairwise(tokens))
    for word in set(tokens):
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

    def contributions(self, text: str, cls: FailureClass) -> list[tuple[str, float]]:
        """The present features' pull towards `cls` (its weight less the mean of the others'),
        strongest first: what made the model say it."""
        columns = sorted({self.index[f]: f for f in features(text) if f in self.index}.items())
        if not columns:
            return []
        scale = 1.0 / math.sqrt(len(columns))
        row = self.classes.index(cls)
        others = [r for r in range(len(self.classes)) if r != row]
        pulls = [
            (
                name,
                scale
                * (self.weights[row][c] - sum(self.weights[o][c] for o in others) / len(others)),
            )
            for c, name in columns
        ]
        return sorted(pulls, key=lambda p: (-p[1], p[0]))

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
