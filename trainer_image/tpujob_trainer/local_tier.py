"""The fast local checkpoint tier: this process's own shards of the state, on its host.

Role: one process's store in a memory-backed folder of its pod (an `emptyDir` with
`medium: Memory`, `contract.ENV_LOCAL_CHECKPOINT_DIR`). It survives a restart of the training
process inside the pod, which is how soft failures are recovered, and dies with the pod. The
tiers are composed, and the job agrees which one to restore from, in `tiers`.

Layout: `<folder>/<step>/shards.npz` (every addressable shard of every leaf, in flattening
order) and `<folder>/<step>/meta.json` (step, attempt, job uid, and each leaf's shape, dtype
and shard indices). A step is written into `<step>.tmp-<attempt>` and renamed into place, so
a step that is listed was written whole; a temporary folder left by a killed process is
removed when the tier opens. Only this process writes its folder (a pod's supervisor ends one
training process before it starts the next), so no lock is needed.

Concurrency: `save` copies the shards to host memory before it returns (the next step may
donate the device buffers) and writes them on one background thread; `wait` blocks until the
write finished. `committed_step` is the newest step whose write finished.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

SHARDS_FILE = "shards.npz"
META_FILE = "meta.json"
TMP_MARK = ".tmp-"
FORMAT = 1

State = Any
# A shard's place in its array: (start, stop) per dimension.
Index = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class LeafShards:
    """One leaf of the state as this process holds it: its shape, dtype and shards."""

    shape: tuple[int, ...]
    dtype: str
    shards: dict[Index, np.ndarray]

    def whole(self) -> np.ndarray | None:
        """The full array when this process holds every element of it (a replicated leaf)."""
        full = tuple((0, dim) for dim in self.shape)
        return self.shards.get(full)


def _index(index: Sequence[slice], shape: Sequence[int]) -> Index:
    return tuple(
        (s.start or 0, dim if s.stop is None else s.stop)
        for s, dim in zip(index, shape, strict=True)
    )


def host_shards(state: State) -> list[LeafShards]:
    """This process's shards of every leaf, copied to host memory, in flattening order."""
    import jax

    leaves = []
    for leaf in jax.tree.leaves(state):
        if isinstance(leaf, jax.Array):
            shards: dict[Index, np.ndarray] = {}
            for shard in leaf.addressable_shards:
                shards.setdefault(_index(shard.index, leaf.shape), np.array(shard.data, copy=True))
            leaves.append(LeafShards(tuple(leaf.shape), str(leaf.dtype), shards))
        else:
            array = np.array(leaf, copy=True)
            full = tuple((0, d) for d in array.shape)
            leaves.append(LeafShards(tuple(array.shape), str(array.dtype), {full: array}))
    return leaves


def fits(template: State, leaves: Sequence[LeafShards]) -> bool:
    """Whether `leaves` were saved from a state shaped like `template`, with this process
    holding the same shards of it now (the same mesh and the same process index)."""
    wanted = host_shards_layout(template)
    return len(wanted) == len(leaves) and all(
        (w.shape, w.dtype, sorted(w.shards)) == (h.shape, h.dtype, sorted(h.shards))
        for w, h in zip(wanted, leaves, strict=True)
    )


def host_shards_layout(template: State) -> list[LeafShards]:
    """The layout `host_shards(template)` would have, without copying any data."""
    import jax

    out = []
    empty = np.empty((0,), np.uint8)
    for leaf in jax.tree.leaves(template):
        if isinstance(leaf, jax.Array):
            shape, dtype = tuple(leaf.shape), str(leaf.dtype)
            indices = {_index(s.index, shape) for s in leaf.addressable_shards}
        else:
            array = np.asarray(leaf)
            shape, dtype = tuple(array.shape), str(array.dtype)
            indices = {tuple((0, d) for d in shape)}
        out.append(LeafShards(shape, dtype, dict.fromkeys(indices, empty)))
    return out


def _shard(saved: LeafShards, index: tuple[slice, ...] | None) -> np.ndarray:
    """The saved shard at `index` (None: the whole of a scalar)."""
    return saved.shards[_index(index or (), saved.shape)]


def rebuild(template: State, leaves: Sequence[LeafShards]) -> State:
    """`template`'s tree with each leaf made from `leaves` (same shardings as the template)."""
    import jax

    flat, tree = jax.tree.flatten(template)
    built: list[Any] = []
    for leaf, saved in zip(flat, leaves, strict=True):
        if isinstance(leaf, jax.Array):
            built.append(
                jax.make_array_from_callback(saved.shape, leaf.sharding, partial(_shard, saved))
            )
        else:
            whole = saved.whole()
            built.append(whole if whole is not None else next(iter(saved.shards.values())))
    return jax.tree.unflatten(tree, built)


class LocalTier:
    """One process's local checkpoint folder: async saves, listing, loading, pruning."""

    def __init__(self, folder: str, *, keep: int, attempt: int, job_uid: str | None) -> None:
        self._root = Path(folder)
        self._root.mkdir(parents=True, exist_ok=True)
        self._keep = max(1, keep)
        self._attempt = attempt
        self._job_uid = job_uid or ""
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._committed: int | None = None
        for leftover in self._root.glob(f"*{TMP_MARK}*"):
            # A write cut short (the process was killed): never a step.
            shutil.rmtree(leftover, ignore_errors=True)
        self._committed = self.latest_step()

    @property
    def folder(self) -> Path:
        return self._root

    def steps(self) -> list[int]:
        """The committed steps of this tier, oldest first."""
        return sorted(int(p.name) for p in self._root.iterdir() if p.name.isdigit() and p.is_dir())

    def latest_step(self, at_most: int | None = None) -> int | None:
        """The newest committed step (at or before `at_most`), or None."""
        steps = [s for s in self.steps() if at_most is None or s <= at_most]
        return steps[-1] if steps else None

    def committed_step(self) -> int | None:
        """The newest step whose write finished (None before any)."""
        return self._committed

    def saved_by(self, step: int) -> int:
        """The attempt that saved `step` (-1 when its metadata does not say)."""
        try:
            meta = json.loads((self._root / str(step) / META_FILE).read_text())
            return int(meta["attempt"])
        except (OSError, ValueError, KeyError, TypeError):
            return -1

    def save(self, step: int, state: State) -> None:
        """Copy this process's shards to host memory, then write them in the background.

        Raises what the previous write raised (a full or missing volume), so a broken tier
        is noticed at the next save.
        """
        self.wait()
        leaves = host_shards(state)
        self._thread = threading.Thread(
            target=self._write_guarded, args=(step, leaves), name="local-checkpoint", daemon=True
        )
        self._thread.start()

    def wait(self) -> int | None:
        """Block until the pending write finished; the committed step. Raises its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._committed

    def _write_guarded(self, step: int, leaves: list[LeafShards]) -> None:
        try:
            self._write(step, leaves)
        except BaseException as error:  # handed to the training thread by `wait`
            self._error = error

    def _write(self, step: int, leaves: list[LeafShards]) -> None:
        final = self._root / str(step)
        tmp = self._root / f"{step}{TMP_MARK}{self._attempt}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        arrays: dict[str, np.ndarray] = {}
        meta_leaves = []
        for i, leaf in enumerate(leaves):
            indices = []
            for j, (index, data) in enumerate(leaf.shards.items()):
                # Raw bytes: npz has no bfloat16 (and the other ml_dtypes); meta.json names it.
                arrays[f"{i}_{j}"] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
                indices.append([list(bounds) for bounds in index])
            meta_leaves.append({"shape": list(leaf.shape), "dtype": leaf.dtype, "shards": indices})
        with (tmp / SHARDS_FILE).open("wb") as handle:
            np.savez(handle, **arrays)  # type: ignore[arg-type]
        meta = {
            "format": FORMAT,
            "step": step,
            "attempt": self._attempt,
            "jobUid": self._job_uid,
            "leaves": meta_leaves,
        }
        (tmp / META_FILE).write_text(json.dumps(meta))
        if final.exists():
            shutil.rmtree(final)  # the same step saved again after a rollback
        tmp.rename(final)
        self._committed = step
        for old in self.steps()[: -self._keep]:
            shutil.rmtree(self._root / str(old), ignore_errors=True)

    def load(self, step: int) -> list[LeafShards]:
        """The shards saved as `step`; raises OSError or ValueError when they do not load."""
        folder = self._root / str(step)
        meta = json.loads((folder / META_FILE).read_text())
        if meta.get("format") != FORMAT or meta.get("step") != step:
            raise ValueError(f"local checkpoint step {step}: unknown format or step")
        if self._job_uid and meta.get("jobUid") not in ("", self._job_uid):
            raise ValueError(f"local checkpoint step {step} belongs to another job")
        import jax.numpy as jnp

        leaves = []
        with np.load(folder / SHARDS_FILE, allow_pickle=False) as data:
            for i, leaf in enumerate(meta["leaves"]):
                dtype = jnp.dtype(str(leaf["dtype"]))
                shards = {}
                for j, raw in enumerate(leaf["shards"]):
                    index = tuple((int(a), int(b)) for a, b in raw)
                    shape = tuple(b - a for a, b in index)
                    shards[index] = np.array(data[f"{i}_{j}"]).view(dtype).reshape(shape)
                leaves.append(LeafShards(tuple(leaf["shape"]), str(leaf["dtype"]), shards))
        return leaves

    def drop_after(self, step: int | None) -> list[int]:
        """Remove the steps after `step` (all of them for None): a rollback's, or steps no
        longer wanted; the steps removed."""
        gone = [s for s in self.steps() if step is None or s > step]
        for s in gone:
            shutil.rmtree(self._root / str(s), ignore_errors=True)
        if gone:
            self._committed = self.latest_step()
        return gone

    def close(self) -> int | None:
        """Wait for the pending write; the committed step."""
        return self.wait()
