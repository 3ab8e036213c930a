"""Multi-tier checkpoints: the local tier's own store, the choice of tier, fencing on every tier,
and real two-process jobs restoring from their local tiers and from a peer.

The store and the choice run in this (single) process on real orbax checkpoints and real local
folders; the jobs are real trainer processes on the CPU backend.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainer_processes import Launcher, TrainerProcess, free_port

from tpujob_trainer.checkpointing import CORRUPT_FOLDER, ROLLED_BACK_FOLDER, Checkpoints, Source
from tpujob_trainer.contract import LEASE_FENCE_ANNOTATION
from tpujob_trainer.fencing import FencedError, SaveGate
from tpujob_trainer.local_tier import LocalTier, rebuild
from tpujob_trainer.tiers import TieredCheckpoints, choose_local, holds

pytestmark = pytest.mark.trainer


def state(value: float) -> dict[str, Any]:
    import jax.numpy as jnp

    return {
        "w": jnp.full((4, 4), value),
        "b": jnp.arange(3.0) + value,
        "h": jnp.full((2,), value, dtype=jnp.bfloat16),
        "count": jnp.asarray(int(value), dtype=jnp.int32),
    }


def values(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: np.asarray(v).astype(np.float64).tolist() for k, v in tree.items()}


class Lease:
    """A LeaseReader holding the fencing token; it counts its reads."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.reads = 0

    def read_lease_annotations(self, name: str, namespace: str) -> Mapping[str, str]:
        self.reads += 1
        return {} if self.token is None else {LEASE_FENCE_ANNOTATION: self.token}


def tiers(
    root: Path, *, local: tuple[int, ...] = (), persistent: tuple[int, ...] = (), gate: Any = None
) -> TieredCheckpoints:
    """Tiers under `root` holding `local` and `persistent` steps (state(step) each)."""
    store = Checkpoints(str(root / "persistent"), keep=10)
    for step in persistent:
        assert store.save(step, state(float(step)))
        store.wait()
    tier = LocalTier(str(root / "local"), keep=10, attempt=1, job_uid="uid")
    for step in local:
        tier.save(step, state(float(step)))
    tier.wait()
    return TieredCheckpoints(store, tier, gate=gate)


def test_a_local_step_round_trips_bit_for_bit_with_the_templates_shardings(tmp_path: Path) -> None:
    tier = LocalTier(str(tmp_path), keep=2, attempt=3, job_uid="uid")
    tier.save(7, state(7.5))
    assert tier.wait() == 7
    template = state(0.0)
    back = rebuild(template, tier.load(7))
    assert values(back) == values(state(7.5))
    assert {k: (v.dtype, v.sharding) for k, v in back.items()} == {
        k: (v.dtype, v.sharding) for k, v in template.items()
    }


def test_a_write_cut_short_is_never_a_step_and_is_removed_when_the_tier_opens(
    tmp_path: Path,
) -> None:
    (tmp_path / "9.tmp-2").mkdir()
    (tmp_path / "9.tmp-2" / "shards.npz").write_bytes(b"half")
    tier = LocalTier(str(tmp_path), keep=2, attempt=3, job_uid="uid")
    assert tier.steps() == [] and tier.committed_step() is None
    assert not (tmp_path / "9.tmp-2").exists()


def test_the_local_tier_keeps_its_newest_steps_and_a_rollback_drops_later_ones(
    tmp_path: Path,
) -> None:
    tier = LocalTier(str(tmp_path), keep=2, attempt=1, job_uid="uid")
    for step in (2, 4, 6):
        tier.save(step, state(float(step)))
    assert tier.wait() == 6
    assert tier.steps() == [4, 6]
    assert tier.drop_after(4) == [6]
    assert tier.steps() == [4] and tier.committed_step() == 4


def test_a_local_step_of_another_job_is_not_loaded(tmp_path: Path) -> None:
    old = LocalTier(str(tmp_path), keep=2, attempt=1, job_uid="old")
    old.save(4, state(4.0))
    assert old.wait() == 4
    tier = LocalTier(str(tmp_path), keep=2, attempt=1, job_uid="new")
    with pytest.raises(ValueError, match="another job"):
        tier.load(4)


@pytest.mark.parametrize(
    ("local_steps", "persistent", "expected"),
    [
        ([12, 12], 10, 12),
        ([12, -1], 10, 12),
        ([10, 10], 10, 10),
        ([8, 8], 10, None),
        ([-1, -1], 10, None),
        ([-1, -1], None, None),
        ([6, 4], None, 6),
    ],
    ids=[
        "local-newer",
        "one-process-holds-it",
        "equal-prefers-local",
        "persistent-newer",
        "no-local",
        "nothing",
        "local-only",
    ],
)
def test_the_newest_step_of_any_tier_is_chosen_and_local_wins_a_tie(
    local_steps: list[int], persistent: int | None, expected: int | None
) -> None:
    assert choose_local(local_steps, persistent) == expected


@pytest.mark.parametrize(
    ("rows", "process", "expected"),
    [
        ([[12, 2], [12, 2]], 1, True),
        ([[12, 3], [12, 2]], 1, False),
        ([[12, 3], [12, 2]], 0, True),
        ([[12, 3], [6, 4]], 1, False),
        ([[12, 3], [6, 4]], 0, True),
        ([[12, -1], [12, -1]], 1, True),
    ],
    ids=[
        "same-attempt-everywhere",
        "an-older-attempt-s-copy-is-not-read",
        "the-newest-attempt-s-copy-is",
        "an-older-step-is-not-held",
        "a-newer-attempt-s-older-step-does-not-count",
        "no-attempt-recorded-anywhere",
    ],
)
def test_a_process_reads_the_chosen_local_step_only_from_the_newest_attempt_s_copy(
    rows: list[list[int]], process: int, expected: bool
) -> None:
    assert holds(rows, 12, process) is expected


@pytest.mark.parametrize(
    ("peer_attempt", "source", "value"),
    [(1, Source.LOCAL, 12.0), (2, Source.PEER, 99.0)],
    ids=["same-attempt-reads-its-own", "newer-attempt-s-copy-comes-from-the-peer"],
)
def test_processes_that_trained_apart_restore_one_copy_of_a_step_they_both_hold(
    tmp_path: Path, peer_attempt: int, source: Source, value: float
) -> None:
    """Process 1 of 2 holds step 12 saved by attempt 1; process 0 holds step 12 too, saved by
    `peer_attempt` (an attempt that ran without process 1 trained to it again)."""
    import jax

    store = Checkpoints(str(tmp_path / "persistent"), keep=2)
    assert store.save(10, state(10.0))
    store.wait()
    tier = LocalTier(str(tmp_path / "local"), keep=2, attempt=1, job_uid="uid")
    tier.save(12, state(12.0))
    tier.wait()
    peer_rows = iter([[12, peer_attempt, 10], [1, 0, 0]])

    def gather(row: Any) -> list[list[int]]:
        return [next(peer_rows), list(row)]

    def broadcast(tree: Any, is_source: bool) -> Any:
        assert not is_source
        return [np.asarray(leaf) for leaf in jax.tree.leaves(state(99.0))]

    restored = TieredCheckpoints(
        store, tier, gate=None, gather=gather, broadcast=broadcast, process_index=1
    ).restore(state(0.0))
    assert restored is not None
    assert (restored.step, restored.source) == (12, source)
    assert values(restored.state) == values(state(value))


@pytest.mark.parametrize(
    ("local", "persistent", "step", "source"),
    [
        ((10, 12), (10,), 12, Source.LOCAL),
        ((8,), (5, 10), 10, Source.PERSISTENT),
        ((10,), (10,), 10, Source.LOCAL),
        ((), (10,), 10, Source.PERSISTENT),
    ],
    ids=["local-newer", "persistent-newer", "tie", "no-local"],
)
def test_a_restore_reads_the_newest_step_of_any_tier_from_the_fastest(
    tmp_path: Path, local: tuple[int, ...], persistent: tuple[int, ...], step: int, source: Source
) -> None:
    restored = tiers(tmp_path, local=local, persistent=persistent).restore(state(0.0))
    assert restored is not None
    assert (restored.step, restored.source) == (step, source)
    assert values(restored.state) == values(state(float(step)))
    # The heartbeat's checkpoint step stays the persistent tier's: what outlives the pods.
    assert restored.durable_step == max(persistent)


def test_a_corrupt_newest_persistent_step_falls_back_to_a_newer_local_step(tmp_path: Path) -> None:
    saved = tiers(tmp_path, local=(12,), persistent=(10, 14))
    for path in (tmp_path / "persistent" / "14").rglob("*"):
        if path.is_file() and "default" in path.parts:
            path.write_bytes(b"\x85not a checkpoint\x00")
    restored = saved.restore(state(0.0))
    assert restored is not None
    assert (restored.step, restored.source, restored.skipped) == (12, Source.LOCAL, (14,))
    assert values(restored.state) == values(state(12.0))
    assert restored.durable_step == 10
    assert [p.name for p in (tmp_path / "persistent" / CORRUPT_FOLDER).iterdir()] == [
        "14.attempt-0"
    ]


@pytest.mark.parametrize(
    ("resume_at", "step", "source"),
    [(12, 12, Source.LOCAL), (10, 10, Source.PERSISTENT)],
    ids=["local-step-kept", "local-step-rolled-back"],
)
def test_a_rollback_applies_to_every_tier(
    tmp_path: Path, resume_at: int, step: int, source: Source
) -> None:
    saved = tiers(tmp_path, local=(12, 16), persistent=(10, 14))
    restored = saved.restore(state(0.0), resume_at=resume_at)
    assert restored is not None
    assert (restored.step, restored.source) == (step, source)
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == (
        ["12"] if resume_at == 12 else []
    )
    rolled = tmp_path / "persistent" / ROLLED_BACK_FOLDER
    assert sorted(p.name for p in rolled.iterdir()) == ["14.attempt-0"]


def gate(token: str | None, lease: Lease | None = None) -> SaveGate:
    return SaveGate(lease or Lease(token), lease="job-heartbeat", namespace="ns", attempt=2)


def test_a_save_the_lease_does_not_allow_commits_to_no_tier(tmp_path: Path) -> None:
    saver = tiers(tmp_path, gate=gate(None))  # no token: fail closed
    assert not saver.save_local(4, state(4.0))
    assert not saver.save(5, state(5.0))
    saver.wait()
    assert list((tmp_path / "local").iterdir()) == []
    assert Checkpoints(str(tmp_path / "persistent"), keep=1).latest_step() is None


def test_a_fenced_attempt_saves_to_no_tier(tmp_path: Path) -> None:
    saver = tiers(tmp_path, gate=gate("3"))  # attempt 3 owns the checkpoints now
    with pytest.raises(FencedError):
        saver.save_local(4, state(4.0))
    with pytest.raises(FencedError):
        saver.save(5, state(5.0))
    assert list((tmp_path / "local").iterdir()) == []


def test_the_current_attempt_saves_to_both_tiers_and_to_the_local_alone(tmp_path: Path) -> None:
    saver = tiers(tmp_path, gate=gate("2"))
    assert saver.save_local(4, state(4.0))
    assert saver.save(5, state(5.0))
    assert saver.wait() == 5
    assert saver.local_committed_step() == 5
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == ["4", "5"]


# -- real jobs ------------------------------------------------------------------------------

JOB = (
    "--steps",
    "40",
    "--batch-size",
    "8",
    "--seed",
    "3",
    "--checkpoint-interval",
    "10",
    "--step-time",
    "0.05",
    "--log-every",
    "5",
)


def restored_from(process: TrainerProcess) -> tuple[int, str]:
    """The step a trainer restored and the tier it read it from."""
    match = re.search(r"restored step (\d+) from the (\w+) tier", process.log)
    assert match, process.log[-3000:]
    return int(match.group(1)), match.group(2)


def test_a_restarted_job_restores_from_its_local_tiers_and_a_replaced_worker_from_its_peer(
    trainer: Launcher, tmp_path: Path
) -> None:
    def run(
        name: str, local: Path, *extra: str, ckpt: Path = tmp_path / "ckpt"
    ) -> list[TrainerProcess]:
        address = f"127.0.0.1:{free_port()}"
        return [
            trainer(
                *JOB,
                "--checkpoint-dir",
                str(ckpt),
                *extra,
                name=name,
                worker=worker,
                env={
                    "JAX_COORDINATOR_ADDRESS": address,
                    "JAX_NUM_PROCESSES": "2",
                    "JAX_PROCESS_ID": str(worker),
                    # A folder of each worker's own, as each pod has its own volume.
                    "TPUJOB_LOCAL_CHECKPOINT_DIR": str(local / str(worker)),
                    "TPUJOB_LOCAL_CHECKPOINT_INTERVAL_STEPS": "3",
                },
            )
            for worker in range(2)
        ]

    first = run("first", tmp_path / "local", "--fault", "crash@17:worker=1")
    for process in first:
        process.wait(180)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["10"]
    # The same folders, and a copy in which worker 1's pod was replaced (its volume is new).
    shutil.copytree(tmp_path / "local", tmp_path / "replaced")
    shutil.copytree(tmp_path / "ckpt", tmp_path / "ckpt-replaced")
    shutil.rmtree(tmp_path / "replaced" / "1")

    kept = run("kept", tmp_path / "local")
    assert [p.wait(180) for p in kept] == [0, 0]
    step, _ = restored_from(kept[0])
    assert step > 10  # newer than anything persistent: the local tier's
    assert [restored_from(p) for p in kept] == [(step, "local"), (step, "local")]

    replaced = run("replaced", tmp_path / "replaced", ckpt=tmp_path / "ckpt-replaced")
    assert [p.wait(180) for p in replaced] == [0, 0]
    assert [restored_from(p) for p in replaced] == [(step, "local"), (step, "peer")]
    # The peer's copy is the state itself: every worker resumed from, and ended with, the same.
    resumed = f"resumed from step {step}"
    digests = {p.digest(resumed) for p in kept + replaced}
    assert len(digests) == 1
    assert {p.digest("done") for p in kept + replaced} == {kept[0].digest("done")}


def test_local_saves_reuse_a_verdict_to_commit_for_one_persistent_interval_only(
    tmp_path: Path,
) -> None:
    lease = Lease("2")
    saver = tiers(tmp_path, gate=gate(None, lease))
    saver._recheck = 5  # the persistent interval
    for step in (2, 4):
        assert saver.save_local(step, state(float(step)))
    assert lease.reads == 1  # step 2's verdict holds for step 4
    lease.token = "3"  # attempt 3 takes over
    assert saver.save_local(6, state(6.0))  # the window: step 2's verdict is 4 steps old
    with pytest.raises(FencedError):
        saver.save_local(8, state(8.0))  # 6 steps old: asked again, and fenced
    with pytest.raises(FencedError):
        saver.save(10, state(10.0))  # a persistent save always asks
    assert lease.reads == 3
    saver.wait()
    assert sorted(int(p.name) for p in (tmp_path / "local").iterdir()) == [2, 4, 6]


def test_a_verdict_not_to_commit_is_never_reused(tmp_path: Path) -> None:
    lease = Lease(None)
    saver = tiers(tmp_path, gate=gate(None, lease))
    saver._recheck = 100
    assert not saver.save_local(2, state(2.0))
    lease.token = "2"
    assert saver.save_local(4, state(4.0))
    assert lease.reads == 2


def test_a_local_tier_that_fails_is_logged_and_training_goes_on_with_the_persistent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saver = tiers(tmp_path)
    shutil.rmtree(tmp_path / "local")
    (tmp_path / "local").write_text("not a folder: every write fails")
    assert saver.save_local(2, state(2.0))  # the write fails on its thread
    assert not saver.save_local(4, state(4.0))  # and is reported at the next save
    assert saver.save(5, state(5.0))
    assert saver.wait() == 5
    assert "local checkpoint tier" in caplog.text and "training goes on" in caplog.text
