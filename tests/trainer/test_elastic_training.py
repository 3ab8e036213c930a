"""Elastic jobs, trainer side: the global batch is kept on fewer slices, gradients accumulate
over micro-batches when a process's rows are capped, and checkpoints restore across a change of
process count (fewer, then more again) on every tier.

The step runs in this process on the CPU backend; the jobs are real trainer processes with
the variables the operator sets (GKE's TPU and multislice ones, and `TPUJOB_PLANNED_SLICES`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainer_processes import Launcher, TrainerProcess, free_port

from tpujob_trainer.config import load_config
from tpujob_trainer.trainer import degraded_note

pytestmark = pytest.mark.trainer


def train(micro_batches: int, steps: int = 3, batch_size: int = 8) -> dict[str, Any]:
    """The state after `steps` steps of the real model, split into `micro_batches`."""
    import jax

    from tpujob_trainer import model
    from tpujob_trainer.data import make_sequence_batch

    mesh = model.make_mesh()
    step = model.make_train_step(mesh, micro_batches)
    state = model.replicate(mesh, model.init_state(seed=1))
    no_stop = model.shard_global(mesh, np.zeros((1,), np.int32), jax.device_count())
    for index in range(steps):
        batch = make_sequence_batch(1, index, batch_size)
        tokens, targets, mask = (
            model.shard_global(mesh, part, batch_size, micro_batches)
            for part in (batch.tokens, batch.targets, batch.mask)
        )
        state, _loss, _stop = step(state, tokens, targets, mask, no_stop)
    flat: dict[str, Any] = {
        jax.tree_util.keystr(path): np.asarray(model.local_value(leaf))
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
    }
    return flat


# The attention's key bias shifts every score of a query alike, which softmax ignores: its
# gradient is zero in exact arithmetic, and Adam scales the rounding noise left in its place
# into full-size steps. The model's output does not depend on it; every other leaf must agree.
KEY_BIAS = re.compile(r"^\['params'\].*\['key'\]\['bias'\]$")


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_accumulating_micro_batches_trains_the_same_state_as_the_whole_batch(
    micro_batches: int,
) -> None:
    whole, accumulated = train(1), train(micro_batches)
    assert whole.keys() == accumulated.keys()
    compared = [name for name in whole if not KEY_BIAS.match(name)]
    assert len(compared) == len(whole) - 2  # the two layers' key biases only
    for name in compared:
        np.testing.assert_allclose(accumulated[name], whole[name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        (
            ["--batch-size", "32"],
            {"MEGASCALE_NUM_SLICES": "1", "TPUJOB_PLANNED_SLICES": "2"},
            "training on 1 of 2 slices: the global batch of 32 is kept, "
            "32 rows per process instead of 16",
        ),
        (
            ["--batch-size", "32", "--max-rows-per-process", "8"],
            {
                "TPU_WORKER_HOSTNAMES": "h0,h1",
                "TPU_WORKER_ID": "1",
                "MEGASCALE_NUM_SLICES": "1",
                "TPUJOB_PLANNED_SLICES": "2",
            },
            "training on 1 of 2 slices: the global batch of 32 is kept, "
            "16 rows per process instead of 8, in 2 micro-batches of 8 "
            "(--max-rows-per-process 8)",
        ),
        (
            ["--batch-size", "48"],
            {
                "TPU_WORKER_HOSTNAMES": "h0,h1",
                "MEGASCALE_NUM_SLICES": "2",
                "MEGASCALE_SLICE_ID": "1",
                "TPUJOB_PLANNED_SLICES": "3",
            },
            "training on 2 of 3 slices: the global batch of 48 is kept, "
            "12 rows per process instead of 8",
        ),
        (["--batch-size", "32"], {"MEGASCALE_NUM_SLICES": "2"}, None),
        (["--batch-size", "32"], {"TPUJOB_PLANNED_SLICES": "1"}, None),
    ],
    ids=[
        "one-host-slices",
        "two-host-slices-with-a-row-cap",
        "two-of-three",
        "not-elastic",
        "full-strength",
    ],
)
def test_a_degraded_attempt_says_how_it_keeps_the_global_batch(
    argv: list[str], env: dict[str, str], expected: str | None
) -> None:
    assert degraded_note(load_config(argv, {"JAX_COORDINATOR_ADDRESS": "c:1", **env})) == expected


# -- real jobs: 2 slices of 2 hosts, then 1 slice, then 2 again ------------------------------

HOSTS = 2
PLANNED = 2
BATCH = ("--batch-size", "8", "--seed", "3")
# At full strength each process holds 2 rows; on one slice 4, which the cap makes 2 micro-batches.
JOB = (*BATCH, "--checkpoint-interval", "4", "--log-every", "1", "--max-rows-per-process", "2")
LOSS = re.compile(r"step (\d+)/\d+ loss=([0-9.eE+-]+)")


def losses(process: TrainerProcess) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in LOSS.findall(process.log)}


def restored_from(process: TrainerProcess) -> tuple[int, str]:
    match = re.search(r"restored step (\d+) from the (\w+) tier", process.log)
    assert match, process.log[-3000:]
    return int(match.group(1)), match.group(2)


@pytest.mark.long
@pytest.mark.parametrize("local_tier", [False, True], ids=["persistent", "local-and-peer"])
def test_a_job_shrinks_to_one_slice_and_grows_back_resuming_the_newest_step_each_time(
    trainer: Launcher, tmp_path: Path, local_tier: bool
) -> None:
    checkpoints = tmp_path / "ckpt"

    def run(name: str, attempt: int, slices: int, steps: int) -> list[TrainerProcess]:
        address = f"127.0.0.1:{free_port()}"
        processes = []
        for process_id in range(slices * HOSTS):
            env = {
                "TPU_WORKER_HOSTNAMES": ",".join(["localhost"] * HOSTS),
                "TPU_WORKER_ID": str(process_id % HOSTS),
                "MEGASCALE_NUM_SLICES": str(slices),
                "MEGASCALE_SLICE_ID": str(process_id // HOSTS),
                "TPUJOB_PLANNED_SLICES": str(PLANNED),
                "JAX_COORDINATOR_ADDRESS": address,
                "TPUJOB_ATTEMPT": str(attempt),
            }
            if local_tier:
                # Each process index keeps its folder from run to run, so the attempt that
                # grows back finds processes 2 and 3 holding only the first run's older steps.
                env["TPUJOB_LOCAL_CHECKPOINT_DIR"] = str(tmp_path / "local" / str(process_id))
                env["TPUJOB_LOCAL_CHECKPOINT_INTERVAL_STEPS"] = "2"
            processes.append(
                trainer(
                    "--steps",
                    str(steps),
                    "--checkpoint-dir",
                    str(checkpoints),
                    *JOB,
                    env=env,
                    worker=process_id,
                    name=name,
                )
            )
        return processes

    # The same global batches on one process, never interrupted: what every run must match.
    reference = trainer("--steps", "18", *BATCH, name="reference")
    full = run("full", 1, PLANNED, 6)
    assert [p.wait(300) for p in full] == [0] * 4
    degraded = run("degraded", 2, 1, 12)
    assert [p.wait(300) for p in degraded] == [0] * 2
    grown = run("grown", 3, PLANNED, 18)
    assert [p.wait(300) for p in grown] == [0] * 4
    assert reference.wait(300) == 0

    assert "global=4" in full[0].log and "global=2" in degraded[0].log
    assert "global=4" in grown[0].log
    for process in degraded:
        assert (
            "training on 1 of 2 slices: the global batch of 8 is kept, 4 rows per process "
            "instead of 2, in 2 micro-batches of 2" in process.log
        )
    assert not any("training on" in p.log for p in full + grown)
    # Each run resumed the newest step the one before committed, with its exact state.
    for before, after, step in ((full, degraded, 6), (degraded, grown, 12)):
        saved = before[0].digest(f"saving step {step}")
        assert {p.digest("done") for p in before} == {saved}
        assert {p.digest(f"resumed from step {step}") for p in after} == {saved}
        assert all(f"training steps {step + 1}.." in p.log for p in after)
    if local_tier:
        assert [restored_from(p) for p in degraded] == [(6, "local")] * 2
        # Processes 2 and 3 hold step 6 at most: they get step 12 from process 0.
        assert [restored_from(p) for p in grown] == [(12, "local")] * 2 + [(12, "peer")] * 2
    # Every step trained on the whole global batch: the losses are the reference's.
    trained = {**losses(full[0]), **losses(degraded[0]), **losses(grown[0])}
    assert sorted(trained) == list(range(1, 19))
    expected = losses(reference)
    assert [trained[s] for s in sorted(trained)] == pytest.approx(
        [expected[s] for s in sorted(trained)], rel=1e-4, abs=1e-6
    )
