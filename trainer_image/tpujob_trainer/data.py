"""The training data: a fixed random "teacher" function sampled per step, numpy only.

Batches are made on the host from (seed, step), so every process can build the same global
batch and keep its own slice of it, and a resumed run sees exactly the data it would have seen
without the restart. Shared by the JAX and the TensorFlow loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IN_FEATURES = 16


@dataclass(frozen=True)
class Batch:
    """One global batch on the host: inputs and regression targets."""

    x: np.ndarray
    y: np.ndarray


def make_batch(seed: int, step: int, batch_size: int, features: int = IN_FEATURES) -> Batch:
    """The global batch of `step`; the teacher depends on `seed` only, the inputs on both."""
    teacher = np.random.default_rng([seed, 0x7EAC]).standard_normal((features, 1))
    x = np.random.default_rng([seed, step]).standard_normal((batch_size, features))
    y = np.tanh(x @ teacher) + 0.1 * np.sin(3.0 * x[:, :1])
    return Batch(x.astype(np.float32), y.astype(np.float32))
