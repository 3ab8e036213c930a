"""The model and one data-parallel training step: a small flax transformer trained with optax.

A two-layer pre-norm transformer encoder (flax.linen) learns the sorting task of `data`: every
output position predicts, with a softmax over the digits, the digit the sorted sequence holds
there. The configuration is tiny on purpose (about 27k parameters, a few milliseconds a step on
one CPU core) because tests run many trainer processes side by side; the loss still falls from
ln(10) to near zero within a few hundred steps.

Params and optimizer state are plain pytrees of arrays (linen keeps parameters outside the
module), so orbax saves them as such and the step stays a pure function. Nothing here does I/O;
the step function is built once per mesh by `make_train_step`.

A process short of device memory splits its rows of a step into equal micro-batches and
accumulates their gradients (`optax.MultiSteps`) into one optimizer update: the step still
trains on the whole global batch, and the state it saves is the same whatever the split.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from tpujob_trainer.data import SEQUENCE_LENGTH, VOCAB

D_MODEL = 32
HEADS = 2
LAYERS = 2
MLP_WIDTH = 4 * D_MODEL
LEARNING_RATE = 3e-3
DATA_AXIS = "data"

State = dict[str, Any]
StepFn = Callable[
    [State, jax.Array, jax.Array, jax.Array, jax.Array], tuple[State, jax.Array, jax.Array]
]


class Block(nn.Module):
    """Pre-norm self-attention (bidirectional: sorting needs every position) and an MLP."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS)(h, h)
        h = nn.LayerNorm()(x)
        return x + nn.Dense(D_MODEL)(nn.gelu(nn.Dense(MLP_WIDTH)(h)))


class SortingTransformer(nn.Module):
    """Token and learned position embeddings, `LAYERS` blocks, logits over the digits."""

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        position = self.param("position", nn.initializers.normal(0.02), (SEQUENCE_LENGTH, D_MODEL))
        # A batch of another length fails here with JAX's own broadcasting error (the `shape`
        # fault relies on it), instead of being silently cropped.
        x = nn.Embed(VOCAB, D_MODEL)(tokens) + position
        for _ in range(LAYERS):
            x = Block()(x)
        logits: jax.Array = nn.Dense(VOCAB)(nn.LayerNorm()(x))
        return logits


MODEL = SortingTransformer()


def _initial_value(
    path: tuple[Any, ...], shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """One parameter's starting value in flax's default scheme, drawn with numpy."""
    names = [str(getattr(key, "key", key)) for key in path]
    name = names[-1]
    if name == "bias":
        return np.zeros(shape, np.float32)
    if name == "scale":  # LayerNorm
        return np.ones(shape, np.float32)
    if name == "position":
        std = 0.02
    elif name == "embedding":
        std = 1.0 / np.sqrt(shape[-1])
    else:
        # LeCun normal over the axes a kernel contracts with its input: the first one, or the
        # first two (heads, head dim) for the attention's output projection.
        contracted = 2 if len(names) > 1 and names[-2] == "out" else 1
        std = 1.0 / np.sqrt(np.prod(shape[:contracted]))
    return (rng.standard_normal(shape) * std).astype(np.float32)


def init_params(seed: int) -> Any:
    """The transformer's weights, deterministic in `seed`.

    The shapes come from flax (`eval_shape` traces the module without running it); the values
    are drawn on the host, because jitting flax's own initializers costs several seconds of
    XLA compilation per process on a CPU, longer than a whole short training run.
    """
    tokens = jnp.zeros((1, SEQUENCE_LENGTH), jnp.int32)
    shapes = jax.eval_shape(MODEL.init, jax.random.PRNGKey(0), tokens)["params"]
    rng = np.random.default_rng([seed, 0x5027])
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: _initial_value(path, leaf.shape, rng), shapes
    )


def optimizer() -> optax.GradientTransformation:
    """The optimizer every process uses (Adam keeps state, which checkpoints must carry)."""
    return optax.adam(LEARNING_RATE)


def init_state(seed: int) -> State:
    """Params and optimizer state at step 0."""
    params = init_params(seed)
    return {"params": params, "opt_state": optimizer().init(params)}


def loss_fn(params: Any, tokens: jax.Array, targets: jax.Array, mask: jax.Array) -> jax.Array:
    """Cross-entropy per target position, weighted by `mask`, mean over the (global) batch."""
    logits = MODEL.apply({"params": params}, tokens)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.mean(losses * mask)


def _sharding(mesh: Mesh, *axes: str | None) -> NamedSharding:
    # PartitionSpec's constructor is untyped in jax's stubs; keep the one ignore here.
    spec: PartitionSpec = PartitionSpec(*axes)  # type: ignore[no-untyped-call]
    return NamedSharding(mesh, spec)


def make_mesh() -> Mesh:
    """A one-axis mesh over every device of every process: pure data parallelism."""
    return Mesh(np.array(jax.devices()), (DATA_AXIS,))


def make_train_step(mesh: Mesh, micro_batches: int = 1) -> StepFn:
    """The jitted step: batch sharded over the mesh, state replicated.

    Besides the new state and the loss it returns the maximum of a per-device stop flag, so
    a SIGTERM seen by any one process reaches every process in the same step and they all stop
    (and save) at the same step without an extra collective.

    With `micro_batches` > 1 the batch arrays carry a leading micro-batch axis (see
    `shard_global`); the step runs them one after the other and applies one update.
    """
    replicated = _sharding(mesh)
    sharded = _sharding(mesh, DATA_AXIS)
    tx = optimizer()

    def step(
        state: State, tokens: jax.Array, targets: jax.Array, mask: jax.Array, stop: jax.Array
    ) -> tuple[State, jax.Array, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], tokens, targets, mask)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, loss, jnp.max(stop)

    accumulate = optax.MultiSteps(tx, every_k_schedule=micro_batches)

    def accumulated_step(
        state: State, tokens: jax.Array, targets: jax.Array, mask: jax.Array, stop: jax.Array
    ) -> tuple[State, jax.Array, jax.Array]:
        # MultiSteps' state lives for one step only, around the inner optimizer's: checkpoints
        # keep the plain optimizer state, so an attempt with another split restores them.
        start = accumulate.init(state["params"])._replace(inner_opt_state=state["opt_state"])

        def micro(carry: tuple[Any, Any], batch: tuple[jax.Array, ...]) -> tuple[Any, jax.Array]:
            params, accumulated = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
            # Zero updates until the last micro-batch, which applies the mean gradient.
            updates, accumulated = accumulate.update(grads, accumulated, params)
            return (optax.apply_updates(params, updates), accumulated), loss

        (params, accumulated), losses = jax.lax.scan(
            micro, (state["params"], start), (tokens, targets, mask)
        )
        # Equal micro-batches: the mean of their mean losses is the global batch's.
        new_state = {"params": params, "opt_state": accumulated.inner_opt_state}
        return new_state, jnp.mean(losses), jnp.max(stop)

    batch = sharded if micro_batches == 1 else _sharding(mesh, None, DATA_AXIS)
    jitted = jax.jit(
        step if micro_batches == 1 else accumulated_step,
        in_shardings=(replicated, batch, batch, batch, sharded),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=(0,),
    )
    return jitted


def shard_global(
    mesh: Mesh, local: np.ndarray, global_rows: int, micro_batches: int = 1
) -> jax.Array:
    """A global array sharded along its first axis from this process's rows.

    With `micro_batches` > 1, this process's rows are cut into that many equal micro-batches
    along a new leading axis, and micro-batch i of the global array holds micro-batch i of
    every process: each is an equal share of the global batch.
    """
    if micro_batches == 1:
        shape, sharding = (global_rows, *local.shape[1:]), _sharding(mesh, DATA_AXIS)
    else:
        local = local.reshape(micro_batches, -1, *local.shape[1:])
        shape = (micro_batches, global_rows // micro_batches, *local.shape[2:])
        sharding = _sharding(mesh, None, DATA_AXIS)
    array: jax.Array = jax.make_array_from_process_local_data(  # type: ignore[no-untyped-call]
        sharding, local, shape
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
