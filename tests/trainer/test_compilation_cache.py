"""JAX's persistent compilation cache across attempts: the second run of a two-process job loads
what the first compiled, resumes from the same checkpoint folder, and trains to the same state."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from trainer_processes import TrainerProcess

from tpujob_trainer import contract

pytestmark = pytest.mark.trainer

ARGS = ("--batch-size", "8", "--seed", "5", "--checkpoint-interval", "3")
SUMMARY = re.compile(r"compilation cache (\S+): (\d+) hits, (\d+) misses")


def cache_use(worker: TrainerProcess) -> tuple[str, int, int]:
    found = SUMMARY.search(worker.log)
    assert found is not None, worker.log[-2000:]
    return found[1], int(found[2]), int(found[3])


def test_a_second_attempt_loads_what_the_first_compiled_and_trains_the_same(
    job: Callable[..., list[TrainerProcess]], tmp_path: Path
) -> None:
    directory = tmp_path / "ckpt"
    cache = directory / contract.COMPILATION_CACHE_FOLDER
    env = {
        contract.ENV_JAX_COMPILATION_CACHE_DIR: str(cache),
        # The reference model compiles in well under JAX's default floor of one second.
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    first = job("--steps", "6", "--checkpoint-dir", str(directory), *ARGS, name="first", env=env)
    assert [w.wait(180) for w in first] == [0, 0]
    assert [cache_use(w)[:2] for w in first] == [(str(cache), 0), (str(cache), 0)]
    # JAX writes entries from process 0 only (on the CPU backend the other processes' keys
    # differ from process 0's, so they compile again): process 0 is the one to look at.
    assert cache_use(first[0])[2] > 0
    assert any(cache.iterdir())

    second = job("--steps", "9", "--checkpoint-dir", str(directory), *ARGS, name="second", env=env)
    uninterrupted = job("--steps", "9", *ARGS, name="uninterrupted")
    assert [w.wait(180) for w in (*second, *uninterrupted)] == [0, 0, 0, 0]
    assert cache_use(second[0])[1] > 0
    assert "compilation cache" not in uninterrupted[0].log
    assert second[0].digest("resumed from step 6") == first[0].digest("saving step 6")
    assert second[0].digest("done") == uninterrupted[0].digest("done")
