"""Tiny host-side collectives over every process of the job (JAX's multihost utilities).

Used where all processes must reach one decision (fencing, restore, the SIGTERM stop) or share
a few numbers (health). Each call is a collective: every process calls it at the same point.
With one process they return the local row without touching JAX's distributed runtime.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def gather_ints(row: Sequence[int]) -> list[list[int]]:
    """Every process's `row` (same length everywhere), in process order."""
    import jax

    if jax.process_count() == 1:
        return [list(row)]
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray(row, dtype=np.int32))
    return [[int(v) for v in r] for r in np.asarray(gathered).reshape(jax.process_count(), -1)]


def gather_floats(row: Sequence[float]) -> list[list[float]]:
    """Every process's `row` of floats (same length everywhere), in process order."""
    import jax

    if jax.process_count() == 1:
        return [list(row)]
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray(row, dtype=np.float32))
    return [[float(v) for v in r] for r in np.asarray(gathered).reshape(jax.process_count(), -1)]
