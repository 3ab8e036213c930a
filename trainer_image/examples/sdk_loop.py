"""A user's own JAX training loop under tpujob, through the SDK (not the reference trainer).

Data-parallel regression of a random linear teacher with a small MLP, plain JAX + optax. The
loop is what a user writes anyway; the lines marked `# tpujob` are all the SDK asks for. Run
it as the operator would (`TPUJOB_*`, `JAX_*` env) or alone:

    TPUJOB_CHECKPOINT_DIR=/tmp/ckpt python examples/sdk_loop.py --steps 200

`--fault SPEC` (repeatable) injects the reference trainer's faults into it, for drills.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpujob_trainer import sdk

FEATURES, HIDDEN = 8, 32


def init_state(seed: int, tx: optax.GradientTransformation) -> dict[str, Any]:
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = {
        "w1": jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "w2": jax.random.normal(k2, (HIDDEN, 1)) / np.sqrt(HIDDEN),
    }
    return {"params": params, "opt": tx.init(params)}


def make_batch(seed: int, index: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    teacher = np.random.default_rng([seed, 1]).standard_normal((FEATURES, 1))
    x = np.random.default_rng([seed, index]).standard_normal((rows, FEATURES))
    return x.astype(np.float32), (x @ teacher).astype(np.float32)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    # For drills and demos: extra host seconds per step, injected faults (the reference
    # trainer's specs) and how often the workers' health numbers are gathered.
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--fault", action="append", default=[], metavar="SPEC")
    parser.add_argument("--health-every", type=int, default=None, metavar="STEPS")
    args = parser.parse_args()
    sdk.setup_logging()  # tpujob
    with sdk.Job.from_env(
        steps=args.steps,
        checkpoint_interval=10,  # tpujob
        faults=args.fault,
        health_every=args.health_every,
    ) as job:
        mesh = Mesh(np.array(jax.devices()), ("data",))
        replicated = NamedSharding(mesh, PartitionSpec())
        sharded = NamedSharding(mesh, PartitionSpec("data"))
        tx = optax.adam(1e-2)

        @jax.jit
        def train_step(state: dict[str, Any], x: jax.Array, y: jax.Array) -> Any:
            def loss_fn(params: dict[str, Any]) -> jax.Array:
                return jnp.mean((jnp.tanh(x @ params["w1"]) @ params["w2"] - y) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(state["params"])
            updates, opt = tx.update(grads, state["opt"], state["params"])
            return {"params": optax.apply_updates(state["params"], updates), "opt": opt}, loss

        state = jax.device_put(init_state(args.seed, tx), replicated)
        state, start = job.restore(state)  # tpujob
        local_rows = args.batch_size // jax.process_count()
        first = jax.process_index() * local_rows

        def global_batch(index: int) -> tuple[jax.Array, jax.Array]:
            x, y = make_batch(args.seed, index, args.batch_size)
            rows = slice(first, first + local_rows)
            return tuple(  # type: ignore[return-value]
                jax.make_array_from_process_local_data(sharded, part[rows], part.shape)
                for part in (x, y)
            )

        for step, (x, y) in job.batches(start, global_batch):  # tpujob
            state, loss = train_step(state, x, y)
            if args.step_time:
                time.sleep(args.step_time)
            job.step_done(step, loss, state)  # tpujob


if __name__ == "__main__":
    main()
