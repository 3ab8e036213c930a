"""How the trainer reads its job from the environment the operator or GKE sets."""

from __future__ import annotations

import pytest

from tpujob_trainer.config import (
    Distributed,
    Framework,
    load_config,
    load_loop_config,
    resolve_distributed,
)
from tpujob_trainer.contract import ExitCode
from tpujob_trainer.failures import TrainerError
from tpujob_trainer.faults import FaultKind

pytestmark = pytest.mark.trainer

CASES = [
    ({}, None),
    (
        {
            "JAX_COORDINATOR_ADDRESS": "job-0.svc:1234",
            "JAX_NUM_PROCESSES": "4",
            "JAX_PROCESS_ID": "3",
            "TPU_WORKER_ID": "1",
            "TPU_WORKER_HOSTNAMES": "a,b",
        },
        Distributed("job-0.svc:1234", 4, 3),
    ),
    ({"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "localhost"}, None),
    ({"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3"}, Distributed("h0:8476", 4, 1)),
    (
        {
            "TPU_WORKER_ID": "1",
            "TPU_WORKER_HOSTNAMES": "s1h0,s1h1",
            "MEGASCALE_NUM_SLICES": "2",
            "MEGASCALE_SLICE_ID": "1",
            "MEGASCALE_COORDINATOR_ADDRESS": "s0h0:8080",
        },
        Distributed("s0h0:8476", 4, 3),
    ),
    (
        {
            "TPU_WORKER_ID": "0",
            "TPU_WORKER_HOSTNAMES": "h0,h1",
            "JAX_COORDINATOR_ADDRESS": "given:9999",
        },
        Distributed("given:9999", 2, 0),
    ),
    ({"JAX_COORDINATOR_ADDRESS": "c:1", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}, None),
]


@pytest.mark.parametrize(
    ("env", "expected"),
    CASES,
    ids=[
        "nothing-set-is-single-process",
        "operator-jax-variables-win-over-gke",
        "single-host-gke-is-single-process",
        "multi-host-slice-uses-worker-0-on-8476",
        "multislice-process-id-is-slice-major",
        "explicit-coordinator-overrides-the-derived-one",
        "one-process-needs-no-coordinator",
    ],
)
def test_distributed_settings_come_from_env(
    env: dict[str, str], expected: Distributed | None
) -> None:
    assert resolve_distributed(env) == expected


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        ([], {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0"}),
        ([], {"JAX_COORDINATOR_ADDRESS": "c:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "2"}),
        (["--batch-size", "3"], {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "a,b"}),
        ([], {"TPUJOB_FAULTS": "explode@3"}),
        ([], {"TPUJOB_CHECKPOINT_INTERVAL_STEPS": "often"}),
        (["--steps", "many"], {}),
        ([], {"TPUJOB_FRAMEWORK": "pytorch"}),
    ],
    ids=[
        "process-count-without-coordinator",
        "process-id-out-of-range",
        "batch-not-divisible-by-processes",
        "unknown-fault-kind",
        "non-integer-env",
        "bad-flag-value",
        "unknown-framework-from-the-job",
    ],
)
def test_invalid_config_is_a_config_error(argv: list[str], env: dict[str, str]) -> None:
    with pytest.raises(TrainerError) as caught:
        load_config(argv, env)
    assert caught.value.exit_code is ExitCode.CONFIG_ERROR


def test_env_supplies_defaults_and_flags_override_them() -> None:
    env = {
        "TPUJOB_CHECKPOINT_DIR": "gs://bucket/run",
        "TPUJOB_CHECKPOINT_INTERVAL_STEPS": "7",
        "TPUJOB_CHECKPOINT_KEEP": "2",
        "TPUJOB_FAULTS": "crash@5:worker=1, hang@9",
        "TPUJOB_ATTEMPT": "3",
        "TPUJOB_COLLECTIVE_TIMEOUT_SECONDS": "90",
        "TPUJOB_ALLOW_CPU_FALLBACK": "true",
        "TPUJOB_EXPECT_TPU_CHIPS_PER_HOST": "4",
    }
    config = load_config(["--keep", "5", "--fault", "shape@2", "--framework", "tensorflow"], env)
    assert (config.checkpoint_dir, config.checkpoint_interval, config.keep) == (
        "gs://bucket/run",
        7,
        5,
    )
    assert [f.kind for f in config.faults] == [FaultKind.SHAPE, FaultKind.CRASH, FaultKind.HANG]
    assert (config.attempt, config.collective_timeout_seconds) == (3, 90)
    assert config.allow_cpu_fallback and config.expect_tpu_chips_per_host == 4
    assert config.framework is Framework.TENSORFLOW


def test_a_loop_s_own_faults_and_health_interval_join_the_environment_s() -> None:
    """A job's spec cannot set TPUJOB_ variables, so an SDK loop passes its drill's faults
    and health interval itself; the environment's faults still apply."""
    env = {"TPUJOB_FAULTS": "crash@7", "TPUJOB_HEALTH_EVERY_STEPS": "20"}
    config = load_loop_config(
        env, steps=50, faults=["slow-input@3", "straggle@1:worker=1"], health_every=5
    )
    assert sorted(f.kind for f in config.faults) == sorted(
        [FaultKind.CRASH, FaultKind.SLOW_INPUT, FaultKind.STRAGGLE]
    )
    assert config.health_every == 5
    assert load_loop_config(env, steps=50).health_every == 20


def test_a_loop_s_bad_fault_spec_is_a_config_error() -> None:
    with pytest.raises(TrainerError) as raised:
        load_loop_config({}, steps=10, faults=["melt@3"])
    assert raised.value.exit_code is ExitCode.CONFIG_ERROR


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([], {}, Framework.JAX, id="run-by-hand"),
        pytest.param([], {"TPUJOB_FRAMEWORK": "tensorflow"}, Framework.TENSORFLOW, id="job-spec"),
        pytest.param(
            ["--framework", "jax"], {"TPUJOB_FRAMEWORK": "tensorflow"}, Framework.JAX, id="flag"
        ),
    ],
)
def test_the_jobs_framework_picks_the_loop_unless_the_flag_says_otherwise(
    argv: list[str], env: dict[str, str], expected: Framework
) -> None:
    assert load_config(argv, env).framework is expected


@pytest.mark.parametrize(
    ("env", "planned", "active"),
    [
        pytest.param({}, 1, 1, id="one-slice-job"),
        pytest.param({"MEGASCALE_NUM_SLICES": "2"}, 2, 2, id="not-elastic-plans-what-it-runs"),
        pytest.param(
            {"MEGASCALE_NUM_SLICES": "2", "TPUJOB_PLANNED_SLICES": ""}, 2, 2, id="empty-is-absent"
        ),
        pytest.param(
            {"MEGASCALE_NUM_SLICES": "2", "TPUJOB_PLANNED_SLICES": "2"}, 2, 2, id="full-strength"
        ),
        pytest.param(
            {"MEGASCALE_NUM_SLICES": "1", "TPUJOB_PLANNED_SLICES": "4"}, 4, 1, id="degraded"
        ),
        pytest.param({"TPUJOB_PLANNED_SLICES": "2"}, 2, 1, id="slices-default-to-one"),
    ],
)
def test_the_planned_and_active_slices_come_from_the_elastic_variables(
    env: dict[str, str], planned: int, active: int
) -> None:
    config = load_config([], env)
    assert (config.planned_slices, config.active_slices) == (planned, active)
    assert config.degraded is (active < planned)


@pytest.mark.parametrize(
    ("argv", "env", "named"),
    [
        ([], {"MEGASCALE_NUM_SLICES": "2", "TPUJOB_PLANNED_SLICES": "1"}, "TPUJOB_PLANNED_SLICES"),
        ([], {"TPUJOB_PLANNED_SLICES": "two"}, "TPUJOB_PLANNED_SLICES"),
        ([], {"TPUJOB_PLANNED_SLICES": "0"}, "TPUJOB_PLANNED_SLICES"),
        ([], {"MEGASCALE_NUM_SLICES": "0"}, "MEGASCALE_NUM_SLICES"),
        (["--batch-size", "8", "--max-rows-per-process", "3"], {}, "equal micro-batches"),
        (["--max-rows-per-process", "0"], {}, "--max-rows-per-process"),
    ],
    ids=[
        "planned-fewer-than-the-attempt-s",
        "planned-not-an-integer",
        "planned-zero",
        "no-slices",
        "rows-do-not-split-evenly",
        "cap-below-one",
    ],
)
def test_invalid_elastic_settings_are_a_config_error_naming_what_is_wrong(
    argv: list[str], env: dict[str, str], named: str
) -> None:
    with pytest.raises(TrainerError) as caught:
        load_config(argv, env)
    assert caught.value.exit_code is ExitCode.CONFIG_ERROR
    assert named in str(caught.value)


TWO_HOSTS = {"JAX_COORDINATOR_ADDRESS": "c:1", "TPU_WORKER_HOSTNAMES": "h0,h1"}


@pytest.mark.parametrize(
    ("argv", "env", "rows", "micro_batches"),
    [
        pytest.param(["--batch-size", "32"], {}, 32, 1, id="no-cap"),
        pytest.param(["--batch-size", "32", "--max-rows-per-process", "32"], {}, 32, 1, id="fits"),
        pytest.param(
            ["--batch-size", "32", "--max-rows-per-process", "8"], {}, 32, 4, id="four-of-eight"
        ),
        pytest.param(
            ["--batch-size", "24", "--max-rows-per-process", "7"], {}, 24, 4, id="rounded-up"
        ),
        pytest.param(
            ["--batch-size", "32", "--max-rows-per-process", "8"],
            {**TWO_HOSTS, "MEGASCALE_NUM_SLICES": "2"},
            8,
            1,
            id="full-strength-fits",
        ),
        pytest.param(
            ["--batch-size", "32", "--max-rows-per-process", "8"],
            {**TWO_HOSTS, "MEGASCALE_NUM_SLICES": "1", "TPUJOB_PLANNED_SLICES": "2"},
            16,
            2,
            id="degraded-accumulates",
        ),
        pytest.param(
            ["--batch-size", "8", "--max-rows-per-process", "3", "--framework", "tensorflow"],
            {},
            8,
            1,
            id="tensorflow-ignores-the-cap",
        ),
    ],
)
def test_a_process_s_rows_split_into_the_fewest_equal_micro_batches_under_the_cap(
    argv: list[str], env: dict[str, str], rows: int, micro_batches: int
) -> None:
    config = load_config(argv, env)
    assert (config.rows_per_process, config.micro_batches) == (rows, micro_batches)
