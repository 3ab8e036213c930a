"""A user's own JAX loop that knows nothing of tpujob: no SDK, no heartbeat, no exit contract.

Trains a tiny linear model for `--seconds` and exits 0, printing its loss now and then.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, required=True)
    seconds = parser.parse_args().seconds
    key = jax.random.PRNGKey(0)
    inputs = jax.random.normal(key, (64, 8))
    targets = inputs @ jnp.arange(8.0)
    weights = jnp.zeros(8)

    @jax.jit
    def step(w: jax.Array) -> tuple[jax.Array, jax.Array]:
        loss, grad = jax.value_and_grad(lambda v: jnp.mean((inputs @ v - targets) ** 2))(w)
        return w - 0.05 * grad, loss

    end, count = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        weights, loss = step(weights)
        count += 1
        if count % 50 == 0:
            print(f"step {count} loss {float(loss):.4f}", flush=True)
        time.sleep(0.1)
    print(f"done after {count} steps", flush=True)


if __name__ == "__main__":
    main()
