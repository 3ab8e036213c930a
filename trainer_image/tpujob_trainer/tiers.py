"""Multi-tier checkpoints: a fast local tier on each host, the persistent folder behind it.

Role: the saver of a job whose pods have a local checkpoint volume
(`contract.ENV_LOCAL_CHECKPOINT_DIR`). It saves every `local_interval` steps to the local tier
(`local_tier.LocalTier`, a memory-backed folder per pod) and on the persistent interval to
both tiers (`checkpointing.Checkpoints`), and at start it restores from the best tier:

* **local**: the newest step is in the local tier of every process (the pods were kept and
  their training processes restarted in place): each process reads its own shards; nothing
  crosses the network or touches the persistent storage.
* **peer**: some processes hold the newest step and others do not (their pods were replaced)
  and the state is replicated on every process (data parallelism, as the reference trainer
  trains): the lowest process that read the step broadcasts it to all. Every host already
  holds a whole replica of such a state, so a peer copy costs no extra memory. A state
  sharded across processes (model parallelism) has no peer replica here, and falls back to
  the persistent tier: keeping a second copy of another host's shards would double the
  tier's memory for a restore that the persistent tier also serves.
* **persistent**: otherwise, with the persistent tier's own rules (retries, corrupt steps
  moved aside, rollbacks; see `checkpointing`).

Never older: the job restores the newest step of any tier, agreed by every process (each
contributes its newest local step; the persistent tier's listing is shared). A local step as
new as the persistent one wins (it is faster to read). If the persistent tier had to fall
back past a corrupt step to one older than a local step, the local step is restored instead.
A rollback (`resume_at`) applies to every tier: local steps after it are removed and
persistent ones moved aside.

Another process count (an elastic job's attempt on fewer slices, or back on all of them): a
replicated state's shards are whole arrays whatever the count, so any local copy fits, and only
the processes of this attempt are asked (a missing index simply has no copy). Processes that
trained apart may hold the same step number saved by different attempts, with values that
differ in their last bits (another split of the batch) or more (a rollback in between): only
the newest attempt's copies are read, and the others take theirs from a peer, so every replica
starts from one state.

Fencing guards every tier: a persistent save first asks the job's `SaveGate` (one Lease read
and one all-gather), and its verdict holds for both tiers of that step. A local save asks too,
unless the job's last verdict to commit is younger than `recheck_steps` steps (the persistent
interval): saving every few steps, a Lease read per host per save would put thousands of reads
a minute on the API server for a large job. The reuse is decided by step numbers, which every
process shares, so the gate's all-gather is entered by all or by none. The window it leaves is
a fenced process writing its own pod's local tier for up to `recheck_steps` more steps: that
tier is read only by a later training process of the same pod, which the pod's supervisor
starts after it has ended this one, and only by an attempt that restores it as the newest
step of a job that did train to it.
The heartbeat's checkpoint step stays the persistent tier's (what survives losing the pods);
the local tier's committed step is published beside it.

Why not orbax's own multi-tier managers (`orbax.checkpoint.experimental.emergency`, read in
orbax-checkpoint 0.12.8; its `CheckpointManager` does save and restore on CPU hosts with JAX
0.10.2 once `multihost.initialize_distributed_to_device_ids()` was called and absl's flags
were parsed): its local tier exists only for replicas outside the primary one (the replicas
are slices on TPUs, so a job of one slice, the case of most restarts in place, gets no local
tier at all, and process 0 never keeps a local copy); its persistent tier has another layout
(a composite `state` item, OCDBT and Zarr3 forced) that the TensorFlow trainer, the SDK's
existing checkpoints and this trainer's corrupt-step and rollback rules do not share; it
restores one named step with no fallback; and the whole module is marked experimental. Its
peer-to-peer manager (`emergency.p2p`) prefers a peer's step even when the persistent tier
holds a newer one, which breaks the never-older rule above, and serves peers from a TCP port
of its own on each host. The small version here keeps the persistent tier as it is and adds
only the local tier and the choice.

Lifecycle and concurrency as `checkpointing.Checkpoints`: every method is collective except
`committed_step` and `local_committed_step`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from tpujob_trainer.checkpointing import Checkpoints, Restored, Source
from tpujob_trainer.collectives import gather_ints
from tpujob_trainer.fencing import SaveGate
from tpujob_trainer.local_tier import LeafShards, LocalTier, fits, rebuild

log = logging.getLogger(__name__)

State = Any
Broadcast = Callable[[State, bool], State]


def _broadcast(tree: State, is_source: bool) -> State:
    from jax.experimental import multihost_utils

    return multihost_utils.broadcast_one_to_all(tree, is_source=is_source)


def replicated(template: State) -> bool:
    """Whether every process holds every leaf of `template` whole (a peer can restore it)."""
    import jax

    return all(
        leaf.is_fully_replicated if isinstance(leaf, jax.Array) else True
        for leaf in jax.tree.leaves(template)
    )


def choose_local(local_steps: Sequence[int], persistent_step: int | None) -> int | None:
    """Pure: the local step to restore, given every process's newest local step (-1: none)
    and the persistent tier's newest step; None when the persistent tier is the newer one."""
    best = max(local_steps, default=-1)
    if best < 0 or (persistent_step is not None and persistent_step > best):
        return None
    return best


def holds(rows: Sequence[Sequence[int]], step: int, process: int) -> bool:
    """Pure: whether `process` reads local `step` itself, given every process's row of
    (newest local step, the attempt that saved it): it must hold the newest attempt's copy."""
    newest = max((row[1] for row in rows if row[0] == step), default=-1)
    return rows[process][0] == step and rows[process][1] == newest


class TieredCheckpoints:
    """The persistent `Checkpoints` and a `LocalTier`, saved and restored together."""

    def __init__(
        self,
        persistent: Checkpoints,
        local: LocalTier,
        *,
        gate: SaveGate | None,
        gather: Callable[[Sequence[int]], list[list[int]]] = gather_ints,
        broadcast: Broadcast = _broadcast,
        process_index: int = 0,
        recheck_steps: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._persistent = persistent
        self._local = local
        self._gate = gate
        self._recheck = max(1, recheck_steps)
        self._verified: int | None = None  # the step of the job's last verdict to commit
        self._gather = gather
        self._broadcast = broadcast
        self._process = process_index
        self._clock = clock

    # -- saves --------------------------------------------------------------------------------

    def save(self, step: int, state: State) -> bool:
        """Save `step` to both tiers if fencing allows; False when not saved (persistent)."""
        if not self._authorized(step, reuse=False):
            return False
        self._save_local(step, state)
        return self._persistent.save(step, state)

    def save_local(self, step: int, state: State) -> bool:
        """Save `step` to the local tier only, if fencing allows; whether it was started."""
        if not self._authorized(step, reuse=True):
            return False
        return self._save_local(step, state)

    def _save_local(self, step: int, state: State) -> bool:
        """Start a local save; a local tier that fails (full, gone) is logged, not fatal: the
        persistent tier still holds the job's progress, so training goes on."""
        try:
            self._local.save(step, state)
        except OSError as error:
            log.warning(
                "local checkpoint tier %s failed (%s); training goes on, saved by the persistent "
                "tier only until it works again (check spec.checkpoint.local.sizeLimit)",
                self._local.folder,
                error,
            )
            return False
        return True

    def _authorized(self, step: int, *, reuse: bool) -> bool:
        """Whether `step` may be committed; raises `FencedError` when a newer attempt owns the
        checkpoints. With `reuse`, a verdict to commit younger than `recheck_steps` holds."""
        if self._gate is None:
            return True
        if reuse and self._verified is not None and 0 <= step - self._verified < self._recheck:
            return True
        if not self._gate.authorize(step):
            self._verified = None
            return False
        self._verified = step
        return True

    def committed_step(self) -> int | None:
        """The persistent tier's newest committed step: what survives losing the pods."""
        return self._persistent.committed_step()

    def local_committed_step(self) -> int | None:
        """The local tier's newest committed step on this process."""
        return self._local.committed_step()

    def wait(self) -> int | None:
        self._wait_local()
        return self._persistent.wait()

    def close(self) -> int | None:
        self._wait_local()
        return self._persistent.close()

    def _wait_local(self) -> None:
        try:
            self._local.wait()
        except OSError as error:
            log.warning("local checkpoint tier %s failed: %s", self._local.folder, error)

    # -- restore ------------------------------------------------------------------------------

    def restore(self, template: State, *, resume_at: int | None = None) -> Restored | None:
        """The newest step of any tier, read from the fastest tier that has it (see the
        module docstring); None when no tier has a step. Collective."""
        if resume_at is not None:
            dropped = self._local.drop_after(resume_at)
            if dropped:
                log.warning(
                    "local checkpoint steps %s rolled back (resume at %d)", dropped, resume_at
                )
        began = self._clock()
        mine = self._local.latest_step()
        saved_by = -1 if mine is None else self._local.saved_by(mine)
        persistent = self._persistent.latest_step(at_most=resume_at)
        rows = self._gather(
            [-1 if mine is None else mine, saved_by, -1 if persistent is None else persistent]
        )
        newest_persistent = max((row[2] for row in rows), default=-1)
        step = choose_local(
            [row[0] for row in rows], None if newest_persistent < 0 else newest_persistent
        )
        restored: Restored | None = None
        if step is not None:
            restored = self._restore_local(template, step, holds(rows, step, self._process))
            if restored is not None and resume_at is not None:
                self._persistent.roll_back_after(resume_at)
        if restored is None:
            restored = self._persistent.restore(template, resume_at=resume_at)
            newest_local = max((row[0] for row in rows), default=-1)
            if restored is not None and newest_local > restored.step:
                # The persistent tier fell back past corrupt steps to one older than a local
                # step: the local step is the newest good one.
                log.warning(
                    "persistent tier restored step %d; local step %d is newer",
                    restored.step,
                    newest_local,
                )
                better = self._restore_local(
                    template, newest_local, holds(rows, newest_local, self._process)
                )
                if better is not None:
                    restored = Restored(better.state, better.step, restored.skipped, better.source)
        if restored is not None and restored.source is not Source.PERSISTENT:
            # Read after any step was set aside (corrupt, or rolled back).
            durable = self._persistent.latest_step(at_most=resume_at)
            restored = replace(restored, persistent_step=durable)
        if restored is not None:
            log.info(
                "restored step %d from the %s tier in %.2fs",
                restored.step,
                restored.source,
                self._clock() - began,
            )
        return restored

    def _restore_local(self, template: State, step: int, holder: bool) -> Restored | None:
        """`step` from the local tiers: each holder reads its own, and processes that lack it
        get it from a peer when the state is replicated. None (on every process) when that
        cannot serve every process."""
        leaves: list[LeafShards] | None = None
        if holder:
            try:
                loaded = self._local.load(step)
                leaves = loaded if fits(template, loaded) else None
                if leaves is None:
                    log.warning("local checkpoint step %d does not fit this state", step)
            except (OSError, ValueError, KeyError) as error:
                log.warning("local checkpoint step %d does not load: %s", step, error)
        # Three columns, as the first gather's: the all-gather compiled for it is reused.
        rows = self._gather([int(leaves is not None), 0, 0])
        have = [i for i, row in enumerate(rows) if row[0]]
        if not have:
            return None
        if len(have) == len(rows):
            assert leaves is not None
            return Restored(rebuild(template, leaves), step, source=Source.LOCAL)
        if not replicated(template):
            log.warning(
                "local checkpoint step %d is held by processes %s only and the state is "
                "sharded across processes: restoring from the persistent tier",
                step,
                have,
            )
            return None
        source = have[0]
        wholes = self._wholes(template, leaves if self._process == source else None)
        received = self._broadcast(wholes, self._process == source)
        if leaves is not None:
            return Restored(rebuild(template, leaves), step, source=Source.LOCAL)
        return Restored(_from_wholes(template, received), step, source=Source.PEER)

    @staticmethod
    def _wholes(template: State, leaves: list[LeafShards] | None) -> list[Any]:
        """The broadcast's payload: whole arrays from the source, zeros of the same shapes
        elsewhere (every process must pass the same shapes)."""
        import jax
        import numpy as np

        if leaves is not None:
            out = []
            for leaf in leaves:
                whole = leaf.whole()
                assert whole is not None  # a replicated state: every shard is whole
                out.append(whole)
            return out
        return [np.zeros(np.shape(x), x.dtype) for x in jax.tree.leaves(template)]


def _from_wholes(template: State, wholes: Sequence[Any]) -> State:
    """`template`'s tree built from whole arrays (a replicated state's every shard)."""
    import jax
    import numpy as np

    flat, tree = jax.tree.flatten(template)
    leaves: list[Any] = []
    for leaf, whole in zip(flat, wholes, strict=True):
        array = np.asarray(whole)
        if isinstance(leaf, jax.Array):
            leaves.append(
                jax.make_array_from_callback(array.shape, leaf.sharding, partial(_part, array))
            )
        else:
            leaves.append(array)
    return jax.tree.unflatten(tree, leaves)


def _part(array: Any, index: tuple[slice, ...] | None) -> Any:
    return array if index is None else array[index]
