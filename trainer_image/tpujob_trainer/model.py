"""The model and one data-parallel training step, in plain JAX and optax.

A two-layer MLP regresses the output of the fixed random teacher in `data`. Nothing here does
I/O; the step function is built once per mesh by `make_train_step`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpujob_trainer.data import IN_FEATURES

HIDDEN = 32
LEARNING_RATE = 1e-2
DATA_AXIS = "data"

# Params and optimizer state are plain pytrees of arrays; orbax saves them as such.
State = dict[str, Any]
StepFn = Callable[[State, jax.Array, jax.Array, jax.Array], tuple[State, jax.Array, jax.Array]]


def init_params(seed: int) -> dict[str, jax.Array]:
    """Small MLP weights, deterministic in `seed`."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {
        "w1": jax.random.normal(k1, (IN_FEATURES, HIDDEN)) / np.sqrt(IN_FEATURES),
        "b1": jnp.zeros((HIDDEN,)),
        "w2": jax.random.normal(k2, (HIDDEN, 1)) / np.sqrt(HIDDEN),
        "b2": jnp.zeros((1,)),
    }


def optimizer() -> optax.GradientTransformation:
    """The optimizer every process uses (Adam keeps state, which checkpoints must carry)."""
    return optax.adam(LEARNING_RATE)


def init_state(seed: int) -> State:
    """Params and optimizer state at step 0."""
    params = init_params(seed)
    return {"params": params, "opt_state": optimizer().init(params)}


def forward(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """The MLP."""
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return hidden @ params["w2"] + params["b2"]


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error over the (global) batch."""
    return jnp.mean((forward(params, x) - y) ** 2)


def _sharding(mesh: Mesh, *axes: str) -> NamedSharding:
    # PartitionSpec's constructor is untyped in jax's stubs; keep the one ignore here.
    spec: PartitionSpec = PartitionSpec(*axes)  # type: ignore[no-untyped-call]
    return NamedSharding(mesh, spec)


def make_mesh() -> Mesh:
    """A one-axis mesh over every device of every process: pure data parallelism."""
    return Mesh(np.array(jax.devices()), (DATA_AXIS,))


def make_train_step(mesh: Mesh) -> StepFn:
    """The jitted step: batch sharded over the mesh, state replicated.

    Besides the new state and the loss it returns the maximum of a per-device stop flag, so
    a SIGTERM seen by any one process reaches every process in the same step and they all stop
    (and save) at the same step without an extra collective.
    """
    replicated = _sharding(mesh)
    sharded = _sharding(mesh, DATA_AXIS)
    tx = optimizer()

    def step(
        state: State, x: jax.Array, y: jax.Array, stop: jax.Array
    ) -> tuple[State, jax.Array, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], x, y)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, loss, jnp.max(stop)

    jitted = jax.jit(
        step,
        in_shardings=(replicated, sharded, sharded, sharded),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=(0,),
    )
    return jitted


def shard_global(mesh: Mesh, local: np.ndarray, global_rows: int) -> jax.Array:
    """A global array sharded along its first axis from this process's rows."""
    shape = (global_rows, *local.shape[1:])
    array: jax.Array = jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
        _sharding(mesh, DATA_AXIS), local, shape
    )
    return array


def replicate(mesh: Mesh, state: State) -> State:
    """Place a host-built state on every device of the mesh."""
    sharding = _sharding(mesh)
    placed: State = jax.tree.map(
        lambda leaf: jax.make_array_from_callback(
            np.shape(leaf), sharding, lambda _index: np.asarray(leaf)
        ),
        state,
    )
    return placed


def local_value(array: jax.Array) -> np.ndarray:
    """The host value of a replicated array (each process holds a full copy)."""
    return np.asarray(array.addressable_shards[0].data)


def digest(state: State) -> str:
    """SHA-256 over every leaf's bytes: equal digests mean bit-for-bit equal states."""
    hasher = hashlib.sha256()
    for leaf in jax.tree.leaves(state):
        value = local_value(leaf) if isinstance(leaf, jax.Array) else np.asarray(leaf)
        hasher.update(value.dtype.str.encode())
        hasher.update(np.ascontiguousarray(value).tobytes())
    return hasher.hexdigest()[:16]
