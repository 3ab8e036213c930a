"""Reading TPUTrainingJob bodies into models: defaults, derived sizes and refused specs."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from tpujob.api import BadNodeAction, Framework, InvalidJobError, RecoverySpec, parse_job
from tpujob.api.recovery import Backoff

EXAMPLES = Path(__file__).parents[3] / "examples"


def example(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    return data


def minimal() -> dict[str, Any]:
    return {
        "apiVersion": "tpujob.dev/v1alpha1",
        "kind": "TPUTrainingJob",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {
            "tpu": {"accelerator": "tpu-v5p-slice", "topology": "2x2x2"},
            "trainer": {"image": "trainer:1"},
        },
    }


@pytest.mark.parametrize(
    ("name", "hosts", "chips_per_host", "failed_node_budget"),
    [("cpu-local", 4, 4, 1), ("v5e-single-slice", 8, 4, 2), ("v5p-two-slices", 32, 4, 4)],
    ids=["cpu-local", "v5e-single-slice", "v5p-two-slices"],
)
def test_examples_parse_with_derived_sizes(
    name: str, hosts: int, chips_per_host: int, failed_node_budget: int
) -> None:
    job = parse_job(example(name))
    assert job.name == name
    assert job.spec.tpu.total_hosts == hosts
    assert job.spec.tpu.chips_per_host == chips_per_host
    assert job.spec.max_failed_nodes_count() == failed_node_budget


def test_minimal_spec_gets_documented_defaults() -> None:
    spec = parse_job(minimal()).spec
    assert spec.framework is Framework.JAX
    assert spec.tpu.slices == 1
    assert spec.trainer.allow_cpu_fallback is False
    assert spec.recovery.auto_recovery is True
    assert spec.recovery.max_failed_nodes == "20%"
    assert spec.recovery.bad_node_action is BadNodeAction.TAINT
    assert (spec.recovery.backoff.initial_seconds, spec.recovery.backoff.max_seconds) == (10, 300)
    assert spec.checkpoint is None
    assert spec.suspend is False


@pytest.mark.parametrize(
    ("seconds", "valid"), [(0, True), (5, False), (9, False), (10, True), (600, True)]
)
def test_stall_detection_is_off_at_zero_and_never_shorter_than_ten_seconds(
    seconds: int, valid: bool
) -> None:
    body = {"stallTimeoutSeconds": seconds}
    if valid:
        assert RecoverySpec.model_validate(body).stall_timeout_seconds == seconds
    else:
        with pytest.raises(ValidationError, match="0 \\(off\\) or at least 10"):
            RecoverySpec.model_validate(body)


def test_snake_case_names_are_accepted_as_well_as_aliases() -> None:
    spec = RecoverySpec.model_validate({"max_soft_restarts": 2, "maxHardRestarts": 1})
    assert (spec.max_soft_restarts, spec.max_hard_restarts) == (2, 1)


@pytest.mark.parametrize(
    ("value", "total_hosts", "expected"),
    [
        ("20%", 4, 1),
        ("20%", 32, 7),
        ("50%", 3, 2),
        ("0%", 100, 0),
        (3, 16, 3),
        (0, 16, 0),
        ("50%", 3072, 511),
        (900, 3072, 511),
    ],
    ids=[
        "20%-of-4-rounds-up",
        "20%-of-32",
        "50%-of-3",
        "zero-percent",
        "integer",
        "zero",
        "more-than-the-status-records-is-511",
        "an-integer-above-it-too",
    ],
)
def test_failed_node_budget_resolves_to_a_count(
    value: int | str, total_hosts: int, expected: int
) -> None:
    spec = RecoverySpec.model_validate({"maxFailedNodes": value})
    assert spec.max_failed_nodes_count(total_hosts) == expected


@pytest.mark.parametrize(
    ("restarts", "delay"), [(0, 10), (1, 20), (3, 80), (5, 300), (500, 300)], ids=str
)
def test_backoff_doubles_up_to_its_maximum(restarts: int, delay: int) -> None:
    assert Backoff(initial_seconds=10, max_seconds=300).delay(restarts) == delay


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return apply


REFUSED: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    (
        "unknown accelerator",
        _set("spec.tpu.accelerator", "tpu-v9"),
        "spec.tpu.accelerator",
        "unknown accelerator",
    ),
    (
        "topology of another generation",
        _set("spec.tpu.topology", "4x4"),
        "spec.tpu.topology",
        "not offered for tpu-v5p-slice",
    ),
    ("zero slices", _set("spec.tpu.slices", 0), "spec.tpu.slices", "greater than or equal to 1"),
    ("multislice on one host", _set("spec.tpu.topology", "2x2x1"), "spec.tpu", "multi-host"),
    ("too many spares", _set("spec.tpu.spares", 5), "spec.tpu.spares", "less than or equal to 4"),
    (
        "spares of an autoscaled job",
        lambda body: body["spec"]["tpu"].update(spares=1, provisioning="Autoscale"),
        "spec.tpu",
        "spares needs provisioning ExistingPools",
    ),
    (
        "percent budget above half",
        _set("spec.recovery.maxFailedNodes", "80%"),
        "spec.recovery.maxFailedNodes",
        "0% to 50%",
    ),
    (
        "integer budget above half",
        _set("spec.recovery.maxFailedNodes", 3),
        "spec",
        "more than half",
    ),
    (
        "budget not a percentage",
        _set("spec.recovery.maxFailedNodes", "ten"),
        "spec.recovery.maxFailedNodes",
        "percentage",
    ),
    (
        "backoff inverted",
        _set("spec.recovery.backoff", {"initialSeconds": 60, "maxSeconds": 5}),
        "spec.recovery.backoff",
        "initialSeconds must be less than or equal to maxSeconds",
    ),
    (
        "regex does not compile",
        _set("spec.recovery.rules", [{"messagePattern": "(unclosed", "class": "soft"}]),
        "spec.recovery.rules[0].messagePattern",
        "does not compile",
    ),
    (
        "rule without matcher",
        _set("spec.recovery.rules", [{"class": "hard"}]),
        "spec.recovery.rules[0]",
        "at least one of",
    ),
    (
        "rule with unknown class",
        _set("spec.recovery.rules", [{"exitCodes": [3], "class": "mild"}]),
        "spec.recovery.rules[0].class",
        "'soft', 'medium', 'hard' or 'fatal'",
    ),
    ("unknown spec field", _set("spec.replicas", 3), "spec.replicas", "Extra inputs"),
    (
        "reserved env name",
        _set("spec.trainer.env", [{"name": "TPUJOB_ATTEMPT", "value": "1"}]),
        "spec.trainer.env[0].name",
        "set by the operator",
    ),
    (
        "env value and valueFrom",
        _set("spec.trainer.env", [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {}}}]),
        "spec.trainer.env[0]",
        "not both",
    ),
    (
        "duplicate env",
        _set("spec.trainer.env", [{"name": "A"}, {"name": "A"}]),
        "spec.trainer.env",
        "duplicate env names: A",
    ),
    (
        "negative checkpoint interval",
        _set("spec.checkpoint", {"uri": "gs://b/p", "intervalSteps": -5}),
        "spec.checkpoint.intervalSteps",
        "greater than or equal to 1",
    ),
    (
        "checkpoint uri and volume",
        _set("spec.checkpoint", {"uri": "gs://bucket/p", "volume": {"claimName": "pvc"}}),
        "spec.checkpoint",
        "exactly one of uri or volume",
    ),
    (
        "checkpoint uri scheme",
        _set("spec.checkpoint", {"uri": "ftp://host/p"}),
        "spec.checkpoint.uri",
        "only Cloud Storage",
    ),
    (
        "checkpoint file uri",
        _set("spec.checkpoint", {"uri": "file:///data/ckpt"}),
        "spec.checkpoint.uri",
        "use spec.checkpoint.volume",
    ),
    (
        "checkpoint s3 uri",
        _set("spec.checkpoint", {"uri": "s3://bucket/ckpt"}),
        "spec.checkpoint.uri",
        "only Cloud Storage",
    ),
    (
        "checkpoint bucket name",
        _set("spec.checkpoint", {"uri": "gs://Bucket/ckpt"}),
        "spec.checkpoint.uri",
        "should match pattern",
    ),
    (
        "cpu not a quantity",
        _set("spec.trainer.resources", {"cpu": "two"}),
        "spec.trainer.resources.cpu",
        "not a Kubernetes quantity",
    ),
    ("wrong type for slices", _set("spec.tpu.slices", "two"), "spec.tpu.slices", "valid integer"),
]


@pytest.mark.parametrize(
    ("mutate", "path", "message"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_invalid_spec_is_refused_naming_the_field(
    mutate: Callable[[dict[str, Any]], None], path: str, message: str
) -> None:
    body = copy.deepcopy(minimal())
    body["spec"]["tpu"]["slices"] = 2
    mutate(body)
    with pytest.raises(InvalidJobError) as caught:
        parse_job(body)
    assert any(e.path == path and message in e.message for e in caught.value.errors), (
        caught.value.errors
    )
