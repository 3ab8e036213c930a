"""The training data, made on the host with numpy from (seed, index) alone.

Two tasks:

* `make_sequence_batch`, the JAX trainer's: sort a sequence of digits. Each row is
  `SEQUENCE_LENGTH` random digits; the targets are the same digits in ascending order, one per
  position. A model must look at the whole sequence to place each digit (count how many are
  smaller), so it needs attention; the loss starts at ln(VOCAB) and falls within a few hundred
  steps on a CPU.
* `make_batch`, the TensorFlow loop's: regression of a fixed random "teacher" function.

Batches depend on (seed, index) only, so every process builds the same global batch and keeps
its own slice of it, and a resumed run sees exactly the data it would have seen without the
restart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IN_FEATURES = 16
VOCAB = 10
SEQUENCE_LENGTH = 16


@dataclass(frozen=True)
class Batch:
    """One global regression batch on the host: inputs and targets."""

    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class SequenceBatch:
    """One global batch of the sorting task on the host.

    `mask` weighs each target position in the loss (all ones: every position counts); it is
    also where an injected NaN enters the real loss.
    """

    tokens: np.ndarray
    targets: np.ndarray
    mask: np.ndarray


def make_batch(seed: int, step: int, batch_size: int, features: int = IN_FEATURES) -> Batch:
    """The global regression batch of `step`; the teacher depends on `seed` only."""
    teacher = np.random.default_rng([seed, 0x7EAC]).standard_normal((features, 1))
    x = np.random.default_rng([seed, step]).standard_normal((batch_size, features))
    y = np.tanh(x @ teacher) + 0.1 * np.sin(3.0 * x[:, :1])
    return Batch(x.astype(np.float32), y.astype(np.float32))


def make_sequence_batch(
    seed: int, index: int, batch_size: int, length: int = SEQUENCE_LENGTH
) -> SequenceBatch:
    """The global batch number `index` of the sorting task."""
    tokens = np.random.default_rng([seed, index]).integers(0, VOCAB, (batch_size, length))
    return SequenceBatch(
        tokens=tokens.astype(np.int32),
        targets=np.sort(tokens, axis=1).astype(np.int32),
        mask=np.ones((batch_size, length), np.float32),
    )
