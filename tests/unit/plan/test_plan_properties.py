"""Property tests of the planner over untrusted input (issue 31).

Whatever a tenant can write reaches `plan()`: the job's own status (old, or odd but admitted
by the CRD), the heartbeat Lease's annotations (the trainer's, or anyone's who may patch the
Lease), the termination message (the container's, up to 4096 bytes), pods' labels and
statuses, nodes' labels, taints and conditions, log tails. The strategies here build those
objects as the cluster delivers them, with hostile values, and hand them to the operator's own
input path: the cache's record functions (`pod_view`, `node_view`, `heartbeat_view`), `observe`
(`parse_job`, the ownership and placement filters) and the log tails as the Reader bounds and
redacts them. Two properties hold for every example:

* `plan()` returns: it never raises on any input the cluster can deliver.
* every status it writes is one the apiserver accepts: the pydantic status model takes it, and
  so does the generated CRD's openAPIV3Schema (checked by `crd_violations` below for every
  keyword the status schema uses; a keyword it does not know fails a test of its own). A
  status the apiserver refuses (422) wedges the job: every later reconcile writes it again.
  The status written is read back and planned on again, as the next reconcile does.

Each property is checked first on the regressions it found (`REGRESSIONS`, each of which
failed before its fix), then on examples derandomized (no database, a seed from the test
itself), so a failure fails the same way on every run and in CI.
`TPUJOB_PROPERTY_EXAMPLES=N` checks N fresh random examples instead, to look further.
"""

from __future__ import annotations

import json
import math
import os
import re
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.unit.builders import T0, at, cluster, iso, job_body, pod, running_status
from tests.unit.fakes import FakeReader

from tpujob import crdgen
from tpujob.api import (
    VERSION,
    ConditionType,
    Phase,
    TPUTrainingJobStatus,
    contract,
    labels,
    status_patch,
)
from tpujob.api import constants as c
from tpujob.api.attempt import ATTEMPT_HISTORY_LIMIT, FAILURE_HISTORY_LIMIT
from tpujob.api.reasons import ConditionReason, EventReason, TimelineKind
from tpujob.kube.observe import bounded_tail, observe, tails_to_read, with_tails
from tpujob.observed.redact import redact
from tpujob.observed.views import Observed
from tpujob.plan import Plan, plan

JOB, NAMESPACE, UID = "train", "team", "job-uid"
INT64_MAX = 2**63 - 1
HOSTS_PER_SLICE = 2  # tpu-v4-podslice 2x2x2, the shape job_body asks for
POOLS = ("pool-0", "pool-1", "pool-2")

# ---------------------------------------------------------------------------------------------
# The CRD's status schema, and a validator for every keyword it uses.
# ---------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[3]
_CRD = yaml.safe_load(crdgen.output_paths(ROOT)[0].read_text(encoding="utf-8"))
_SERVED = next(v for v in _CRD["spec"]["versions"] if v["name"] == VERSION)
STATUS_SCHEMA: dict[str, Any] = _SERVED["schema"]["openAPIV3Schema"]["properties"]["status"]

# The keywords `crd_violations` checks, and those that constrain nothing.
CHECKED_KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "format",
        "items",
        "maxItems",
        "maxLength",
        "maximum",
        "minimum",
        "properties",
        "required",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
    }
)
INERT_KEYWORDS = frozenset({"description"})
# metav1.Time as the apiserver parses it (RFC 3339, with or without fractions and an offset).
DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?")
# etcd refuses a larger object; the status is most of a job.
MAX_OBJECT_BYTES = int(1.5 * 1024 * 1024)


def schema_keywords(node: Mapping[str, Any]) -> set[str]:
    found = set(node)
    for child in node.get("properties", {}).values():
        found |= schema_keywords(child)
    if "items" in node:
        found |= schema_keywords(node["items"])
    return found


def crd_violations(schema: Mapping[str, Any], value: Any, path: str = "status") -> list[str]:
    """Why the apiserver would refuse `value` under `schema` (empty: it would accept it).

    Unknown fields are not violations: the apiserver prunes them. Integers are the API's
    int64 (a larger one is decoded as a float, which is no integer); numbers must be finite
    (JSON has no NaN or infinity)."""
    if value is None:
        return [f"{path}: null"]
    found: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} not in {schema['enum']}")
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            return [*found, f"{path}: not an object"]
        found += [f"{path}.{k}: required" for k in schema.get("required", ()) if k not in value]
        for key, child in schema.get("properties", {}).items():
            if key in value:
                found += crd_violations(child, value[key], f"{path}.{key}")
    elif kind == "array":
        if not isinstance(value, list):
            return [*found, f"{path}: not an array"]
        if len(value) > schema.get("maxItems", len(value)):
            found.append(f"{path}: {len(value)} items, more than {schema['maxItems']}")
        for i, item in enumerate(value):
            found += crd_violations(schema["items"], item, f"{path}[{i}]")
        list_type = schema.get("x-kubernetes-list-type", "atomic")
        if list_type == "map":
            keys = [
                tuple(item.get(k) for k in schema["x-kubernetes-list-map-keys"]) for item in value
            ]
            if len(set(keys)) != len(keys):
                found.append(f"{path}: duplicate map keys {keys}")
        elif list_type == "set":
            texts = [json.dumps(item, sort_keys=True) for item in value]
            if len(set(texts)) != len(texts):
                found.append(f"{path}: duplicate set items")
    elif kind == "string":
        if not isinstance(value, str):
            return [*found, f"{path}: not a string"]
        if len(value) > schema.get("maxLength", len(value)):
            found.append(f"{path}: {len(value)} characters, more than {schema['maxLength']}")
        if schema.get("format") == "date-time" and not DATE_TIME.fullmatch(value):
            found.append(f"{path}: {value!r} is no date-time")
    elif kind in ("integer", "number"):
        integral = isinstance(value, int) and not isinstance(value, bool)
        if kind == "integer" and not (integral and -INT64_MAX - 1 <= value <= INT64_MAX):
            return [*found, f"{path}: {value!r} is no int64"]
        if not integral and not (isinstance(value, float) and math.isfinite(value)):
            return [*found, f"{path}: {value!r} is no finite number"]
        if value < schema.get("minimum", value):
            found.append(f"{path}: {value!r} below the minimum {schema['minimum']}")
        if value > schema.get("maximum", value):
            found.append(f"{path}: {value!r} above the maximum {schema['maximum']}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            found.append(f"{path}: not a boolean")
    else:
        found.append(f"{path}: schema type {kind!r} unknown to this validator")
    return found


def assert_accepted(status: TPUTrainingJobStatus) -> dict[str, Any]:
    """The status as the operator writes it, checked as the apiserver would check it."""
    written = status_patch(status)
    TPUTrainingJobStatus.model_validate(written)  # raises on a refused field
    assert crd_violations(STATUS_SCHEMA, written) == []
    # JSON as it goes on the wire: no NaN or infinity, and within etcd's object limit.
    assert len(json.dumps(written, allow_nan=False).encode()) < MAX_OBJECT_BYTES
    return written


# ---------------------------------------------------------------------------------------------
# Hostile values. Every strategy is built once, here: hypothesis validates a strategy when it is
# first drawn from, and one built anew inside each example costs more than the plan.
# ---------------------------------------------------------------------------------------------


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def mostly(usual: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """`usual` three times in four, else `odd`: a world mostly as the operator made it, so
    that the hostile values reach the failure handling behind the first checks."""
    return st.one_of(*(usual.map(lambda x: x) for _ in range(3)), odd)


def drop_none(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


EARLIEST = datetime(1, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)


def rfc3339(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


# Times near the reconcile's (a week either way), and the ends of what RFC 3339 can say.
moments = st.integers(-7 * 86400, 7 * 86400).map(lambda s: T0 + timedelta(seconds=s)) | (
    st.sampled_from([EARLIEST, LATEST])
)
timestamps = moments.map(rfc3339)
maybe_timestamps = optional(timestamps)
# A time in an object the kubelet writes, or garbled.
loose_timestamps = optional(
    timestamps | st.sampled_from(["", "yesterday", "2026-13-45T99:99:99Z", "1e400"])
)

# Numbers written as text: in and out of every range, int64 overflow, NaN, infinities,
# Python-only spellings, garbage.
numeric_text = st.one_of(
    st.integers(-5, 10**6).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        [
            str(INT64_MAX),
            str(2**63),
            str(2**64),
            str(10**12 + 1),
            "-1",
            "0",
            "1e400",
            "-1e400",
            "nan",
            "NaN",
            "inf",
            "-inf",
            "Infinity",
            "1_000",
            " 7 ",
            "",
            "0x10",
            "1.5",
            "1e3",
            "9" * 400,
            "\u0663",
        ]
    ),
    st.floats().map(repr),
    st.text(max_size=12),
)
worker_lists = st.lists(numeric_text, max_size=4).map(",".join)

# Label values as the apiserver admits them (63 characters of [-A-Za-z0-9_.], alphanumeric at
# both ends): numbers of any size, leading zeros, underscores, words.
ALNUM = string.ascii_letters + string.digits
label_values = st.one_of(
    st.integers(0, 10**62).map(str),
    st.sampled_from(["007", "1_0", "1.5", "1e3", "x", "latest", "9" * 63]),
    st.builds(
        "{}{}{}".format,
        st.sampled_from(ALNUM),
        st.text(alphabet=ALNUM + "-_.", max_size=20),
        st.sampled_from(ALNUM),
    ),
)
json_scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 0, 1.5, 2**63 - 1, 2**63, 2**70, math.inf, -math.inf, math.nan]),
    st.floats(),
    st.text(max_size=20),
)
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
short_text = st.text(max_size=40)
long_text = short_text | st.integers(0, 5000).map(lambda n: "x" * n)
messages = long_text.map(lambda t: t[: c.MAX_MESSAGE_LENGTH])
big_ints = optional(st.integers(-(2**70), 2**70) | st.sampled_from([-1, 2**63, 2**70]))

EXIT_CODES = [int(code) for code in contract.ExitCode]
FAILURE_CODES = [info.code for info in contract.EXIT_CODES.values()]
CLASS_HINTS = [str(hint) for hint in contract.ClassHint]


def within_message_limit(text: str) -> str:
    """What the kubelet keeps of a termination message: its first 4096 bytes."""
    return text.encode()[: contract.MAX_MESSAGE_BYTES].decode("utf-8", "ignore")


# Messages the trainer's own encoder writes, with fields the contract does not bound.
contract_messages = st.builds(
    contract.TerminationMessage,
    code=st.sampled_from(FAILURE_CODES) | short_text,
    exit_code=st.sampled_from(EXIT_CODES) | st.integers(-(2**70), 2**70),
    class_hint=st.sampled_from(contract.ClassHint),
    summary=long_text,
    step=big_ints,
    checkpoint_step=big_ints,
    backend=optional(short_text),
    worker=big_ints,
    traceback=long_text,
    version=st.just(contract.CONTRACT_VERSION) | st.integers(-5, 2**70),
).map(contract.encode_termination_message)
# A message as the contract has it, but for a field or two of the wrong type or out of range
# (JSON as Python writes it: NaN and Infinity are numbers too).
MESSAGE_KEYS = [
    "code",
    "exit_code",
    "class_hint",
    "step",
    "checkpoint_step",
    "worker",
    "summary",
    "traceback",
    "backend",
    "version",
]
odd_json = mostly(
    st.sampled_from(
        [
            math.inf,
            -math.inf,
            math.nan,
            2**70,
            -(2**70),
            2**63,
            -1,
            1.5,
            "7",
            "",
            True,
            None,
            [],
            {},
        ]
    ),
    json_values,
)
odd_messages = st.builds(
    lambda message, odd: json.dumps({**message, **odd}),
    st.fixed_dictionaries(
        {
            "code": st.sampled_from(FAILURE_CODES),
            "exit_code": st.sampled_from(EXIT_CODES),
            "class_hint": st.sampled_from(CLASS_HINTS),
            "summary": short_text,
        },
        optional={"step": st.integers(0, 10**6), "checkpoint_step": st.integers(0, 10**6)},
    ),
    st.dictionaries(st.sampled_from(MESSAGE_KEYS), odd_json, min_size=1, max_size=2),
)
termination_messages = st.one_of(
    odd_messages,
    odd_messages.map(lambda x: x),  # twice as likely as the others
    st.just(""),
    short_text,
    contract_messages,
    # Cut short (the trainer died while writing it), or 4096 bytes of anything.
    st.builds(lambda text, cut: text[:cut], contract_messages, st.integers(0, 200)),
    st.text(min_size=1, max_size=50).map(lambda t: t * (4096 // len(t.encode()) + 1)),
).map(within_message_limit)
log_lines = st.sampled_from(
    [
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17.2G",
        "Gloo all-reduce failed: Connection closed by peer",
        "DEADLINE_EXCEEDED: barrier timed out",
        "Traceback (most recent call last):",
        "ValueError: dot_general requires contracting dimensions to have the same shape",
        "FloatingPointError: loss is nan at step 99999999999999999999",
        "password=hunter2 token: abc",
    ]
)
log_tails = st.just("") | st.text(max_size=200) | st.lists(log_lines, max_size=4).map("\n".join)

# ---------------------------------------------------------------------------------------------
# Raw objects as the cluster delivers them.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """One reconcile's raw input: the job body and what the watches hold."""

    body: dict[str, Any]
    pods: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    lease: dict[str, Any] | None
    logs: dict[str, str]
    now: datetime
    heartbeats_seen_since: datetime | None


TAINTS = [
    labels.UNREACHABLE_TAINT,
    labels.NOT_READY_TAINT,
    labels.OUT_OF_SERVICE_TAINT,
    labels.BAD_NODE_TAINT,
    *labels.MAINTENANCE_TAINTS,
]
node_label_extras = st.dictionaries(
    st.sampled_from(
        [*labels.MAINTENANCE_LABELS, labels.SCHEDULED_MAINTENANCE_LABEL, labels.HOSTNAME]
    ),
    st.sampled_from([*labels.MAINTENANCE_LABELS.values()]) | label_values,
    max_size=2,
)
node_parts = st.fixed_dictionaries(
    {
        "pool": mostly(st.none(), label_values),  # None: the pool the node is in
        "no_pool": st.integers(0, 5),  # 0: no node pool label at all
        "accelerator": st.sampled_from(["tpu-v4-podslice", "tpu-v4-podslice", "tpu-v5p-slice"]),
        "topology": st.sampled_from(["2x2x2", "2x2x2", "2x2x1", "9x9"]),
        "extras": node_label_extras,
        "ready": mostly(
            st.fixed_dictionaries(
                {
                    "type": st.just("Ready"),
                    "status": st.sampled_from(["True", "True", "True", "False", "Unknown", "?"]),
                },
                optional={"lastTransitionTime": timestamps},
            ),
            st.none(),
        ),
        "taints": st.lists(
            st.fixed_dictionaries(
                {
                    "key": st.sampled_from(TAINTS) | short_text,
                    "effect": st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule"]),
                }
            ),
            max_size=2,
        ),
        "capacity": st.sampled_from(["4", "4", "0", "8", "1k", "-1", "abc", "9" * 30, ""]),
        "allocatable": st.sampled_from(["4", "4", "0", "8", "1k", "-1", "abc", "9" * 30, ""]),
        "unschedulable": st.booleans(),
        "uid": st.sampled_from(["own", "own", "other"]),
        "mark": optional(st.just(f"{NAMESPACE}/{JOB}: NODE_LOST") | short_text),
    }
)


def raw_node(name: str, pool: str, parts: Mapping[str, Any]) -> dict[str, Any]:
    node_labels = {
        labels.NODEPOOL: parts["pool"] or pool,
        labels.ACCELERATOR: parts["accelerator"],
        labels.TOPOLOGY: parts["topology"],
        **parts["extras"],
    }
    if not parts["no_pool"]:
        del node_labels[labels.NODEPOOL]
    mark = parts["mark"]
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}" if parts["uid"] == "own" else "uid-other",
            "labels": node_labels,
            "annotations": {labels.BAD_NODE_REASON: mark} if mark is not None else {},
        },
        "spec": {"taints": parts["taints"], "unschedulable": parts["unschedulable"]},
        "status": {
            "conditions": [parts["ready"]] if parts["ready"] else [],
            "capacity": {labels.TPU_RESOURCE: parts["capacity"]},
            "allocatable": {labels.TPU_RESOURCE: parts["allocatable"]},
        },
    }


terminated_states = st.fixed_dictionaries(
    {
        "exitCode": st.sampled_from([0, 1, 137, 143, 255, *EXIT_CODES])
        | st.integers(-(2**31), 2**31 - 1),
        "message": termination_messages,
    },
    optional={
        "signal": st.integers(-(2**31), 2**31 - 1),
        "reason": st.sampled_from(["Error", "Completed", "OOMKilled", "ContainerCannotRun"])
        | short_text,
        "startedAt": loose_timestamps,
        "finishedAt": loose_timestamps,
    },
)
container_states = mostly(
    terminated_states.map(lambda t: {"terminated": t}),
    st.one_of(
        loose_timestamps.map(lambda t: {"running": drop_none({"startedAt": t})}),
        st.just({"waiting": {"reason": "ContainerCreating"}}),
        st.just({}),
    ),
)
device_reports = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.just(labels.TPU_RESOURCE),
            "resources": st.lists(
                st.fixed_dictionaries(
                    {
                        "resourceID": short_text,
                        "health": st.sampled_from(["Unhealthy", "Healthy", "Unknown"]),
                    }
                ),
                max_size=2,
            ),
        }
    ),
    max_size=1,
)
pod_conditions = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {
                "type": st.just("DisruptionTarget"),
                "status": st.sampled_from(["True", "False"]),
                "reason": st.sampled_from(["PreemptionByScheduler", "EvictionByEvictionAPI"])
                | short_text,
            }
        ),
        st.fixed_dictionaries(
            {"type": st.just("PodScheduled"), "status": st.just("False")},
            optional={
                "reason": st.just("Unschedulable"),
                "message": long_text,
                "lastTransitionTime": loose_timestamps,
            },
        ),
    ),
    max_size=2,
)
pod_parts = st.fixed_dictionaries(
    {
        "slice": st.integers(0, 1),
        "worker": st.integers(0, HOSTS_PER_SLICE - 1),
        # None: the attempt, slice or worker the pod is for; else a label a tenant wrote.
        "attempt_label": mostly(st.none(), label_values),
        "previous": st.integers(0, 3),  # 0: a pod of the attempt before
        "slice_label": mostly(st.none(), label_values),
        "worker_label": mostly(st.none(), label_values),
        "node": st.integers(0, 9),  # 0: none, 1: one that is gone, else one of its pool's
        "pool": mostly(st.none(), label_values),
        "phase": mostly(
            st.sampled_from(["Failed", "Running", "Failed", "Succeeded", "Pending"]), short_text
        ),
        "message": optional(short_text),
        "state": container_states,
        "devices": device_reports,
        "conditions": pod_conditions,
        "owner": st.sampled_from([UID, UID, UID, "uid-other-job"]),
        "created": maybe_timestamps,
        "deleting": mostly(st.none(), timestamps),
        "forged": st.integers(0, 9),  # 0: a name the operator never gives
        "log": log_tails,
    }
)


# A node that no longer exists, its name as long as a node's may be.
GONE_NODE = "gone-" + "n" * (c.MAX_NAME_LENGTH - 5)


def raw_pod(
    parts: Mapping[str, Any],
    attempt: int,
    slices: int,
    nodes: list[dict[str, Any]],
    placed: Mapping[int, str],
) -> dict[str, Any]:
    """A trainer pod of the job: mostly the current attempt's, on its slice's pool, named as
    the operator names the worker its labels say it is."""
    slice_index = parts["slice"] % slices
    previous = attempt if parts["previous"] else max(attempt - 1, 0)
    pod_labels = {
        labels.JOB: JOB,
        labels.ATTEMPT: parts["attempt_label"] or str(previous),
        labels.SLICE: parts["slice_label"] or str(slice_index),
        labels.WORKER: parts["worker_label"] or str(parts["worker"]),
    }
    pool = placed.get(slice_index, POOLS[0])
    in_pool = [
        n["metadata"]["name"] for n in nodes if n["metadata"]["labels"].get(labels.NODEPOOL) == pool
    ]
    node = None  # not scheduled yet
    if parts["node"] == 1 or (parts["node"] and not in_pool):
        node = GONE_NODE
    elif parts["node"]:
        node = in_pool[parts["node"] % len(in_pool)]
    made = "-".join(
        str(_label_number(pod_labels[k])) for k in (labels.ATTEMPT, labels.SLICE, labels.WORKER)
    )
    container: dict[str, Any] = {"name": "trainer", "state": parts["state"]}
    if parts["devices"]:
        container["allocatedResourcesStatus"] = parts["devices"]
    return {
        "metadata": drop_none(
            {
                "name": f"forged-{made}" if parts["forged"] == 0 else f"{JOB}-{made}",
                "namespace": NAMESPACE,
                "uid": f"uid-{made}",
                "labels": pod_labels,
                "ownerReferences": [{"uid": parts["owner"]}],
                "creationTimestamp": parts["created"],
                "deletionTimestamp": parts["deleting"] if parts["forged"] < 3 else None,
            }
        ),
        "spec": drop_none(
            {
                "nodeName": node,
                "nodeSelector": {labels.NODEPOOL: parts["pool"] or pool},
                "containers": [
                    {"name": "trainer", "resources": {"limits": {labels.TPU_RESOURCE: "4"}}}
                ],
            }
        ),
        "status": drop_none(
            {
                "phase": parts["phase"],
                "message": parts["message"],
                "conditions": parts["conditions"],
                "containerStatuses": [container] if parts["state"] else [],
            }
        ),
    }


def _label_number(value: str) -> int:
    """The number `pod_view` reads from a label (0 for none), as the operator names pods."""
    try:
        return int(value)
    except ValueError:
        return 0


HEARTBEAT_NUMBERS = [
    contract.HEARTBEAT_STEP,
    contract.HEARTBEAT_TOTAL_STEPS,
    contract.HEARTBEAT_LOSS,
    contract.HEARTBEAT_STEPS_PER_SECOND,
    contract.HEARTBEAT_CHECKPOINT_STEP,
    contract.HEARTBEAT_HEALTH_STEP,
    contract.HEARTBEAT_INPUT_BOUND_FRACTION,
]
HEARTBEAT_LISTS = [
    contract.HEARTBEAT_WORKER_INPUT_BOUND,
    contract.HEARTBEAT_WORKER_STEP_SECONDS,
    contract.HEARTBEAT_WORKER_RSS_BYTES,
]
lease_parts = st.fixed_dictionaries(
    {
        "numbers": st.dictionaries(st.sampled_from(HEARTBEAT_NUMBERS), numeric_text),
        "lists": st.dictionaries(st.sampled_from(HEARTBEAT_LISTS), worker_lists),
        "other": st.dictionaries(short_text, short_text, max_size=2),
        # None: the job's attempt, as its trainer writes it.
        "attempt": mostly(st.none(), numeric_text),
        "job_uid": st.sampled_from([UID, UID, "uid-earlier-job", "", None]),
        "rejoins": optional(st.sampled_from(["true", "false", "yes"])),
        "renewed": loose_timestamps,
    }
)


def raw_lease(parts: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """The heartbeat Lease: annotations the trainer writes (or anyone who may patch it)."""
    notes = {
        **parts["other"],
        **parts["numbers"],
        **parts["lists"],
        contract.HEARTBEAT_ATTEMPT: parts["attempt"] or str(attempt),
        **drop_none(
            {
                contract.HEARTBEAT_JOB_UID: parts["job_uid"],
                contract.HEARTBEAT_REJOINS: parts["rejoins"],
            }
        ),
    }
    return {
        "metadata": {"name": f"{JOB}-heartbeat", "namespace": NAMESPACE, "annotations": notes},
        "spec": drop_none({"renewTime": parts["renewed"]}),
    }


# ---------------------------------------------------------------------------------------------
# The job's own status: admitted by the CRD, but old or odd.
# ---------------------------------------------------------------------------------------------

# Counters from none to the int64 limit.
counts = st.integers(0, 5) | st.sampled_from(
    [10**6 - 1, 10**6, 2**31, 10**12, INT64_MAX - 1, INT64_MAX]
)
positive_counts = counts.map(lambda n: max(n, 1))
seconds = st.floats(0, 1e7) | st.sampled_from([0.0, 1e300, 1.7976931348623157e308])


def near(limit: int) -> st.SearchStrategy[int]:
    """A list length: none (half the time), short, or at the list's maxItems or one short."""
    return st.sampled_from([0, 0, 0, 0, 1, 2, limit - 1, limit])


def copies(
    template: Mapping[str, Any], length: int, key: str | None = None
) -> list[dict[str, Any]]:
    """`length` copies of `template`, each `key` (a name) its own."""
    if key is None:
        return [dict(template) for _ in range(length)]
    return [{**template, key: f"{template[key]}"[:200] + f"-{i}"} for i in range(length)]


OWN_CONDITIONS = [str(t) for t in ConditionType]
conditions = st.fixed_dictionaries(
    {"status": st.sampled_from(["True", "False", "Unknown"])},
    optional={
        "reason": st.sampled_from([str(r) for r in ConditionReason]),
        "message": messages,
        "lastTransitionTime": timestamps,
    },
)
condition_types = st.lists(
    st.sampled_from(OWN_CONDITIONS) | st.sampled_from(["Ready", "Custom", "Other0"]),
    unique=True,
    max_size=c.MAX_CONDITIONS,
)
failed_nodes = st.fixed_dictionaries(
    {"name": st.sampled_from(["pool-0-w0", "pool-0-w1", "pool-1-w0", "gone"]) | label_values},
    optional={
        "uid": st.sampled_from(["uid-pool-0-w0", "uid-other"]),
        "time": timestamps,
        "code": st.sampled_from(["NODE_LOST", "TPU_UNHEALTHY", "X"]),
        "marked": st.booleans(),
        "jobOnly": st.booleans(),
        "relapsed": st.booleans(),
    },
)
attempt_records = st.fixed_dictionaries(
    {"attempt": positive_counts, "launched": seconds, "ended": seconds},
    optional={
        "firstHeartbeat": seconds,
        "firstStep": counts,
        "restoredStep": counts,
        "failed": st.booleans(),
        "lastStep": counts,
        "stepsPerSecond": seconds,
        "inputBoundFraction": st.floats(0, 1),
        "checkpointStep": counts,
    },
)
failure_records = st.fixed_dictionaries(
    {
        "signature": st.text(max_size=60),
        "code": st.sampled_from([*FAILURE_CODES, "NODE_LOST", "HANG", "X"]),
    },
    optional={
        "step": counts,
        "node": st.sampled_from(["pool-0-w0", "pool-1-w1", "gone"]),
        "attempt": positive_counts,
        "slice": counts,
        "class": st.sampled_from(["soft", "medium", "hard", "fatal", "?"]),
        "memorySignature": st.text(max_size=64),
        "progressed": st.booleans(),
    },
)
timeline_events = st.fixed_dictionaries(
    {
        "time": timestamps,
        "kind": st.sampled_from([str(k) for k in TimelineKind]),
        "message": messages,
    }
)
pending_events = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["Normal", "Warning"]),
        "reason": st.sampled_from([str(r) for r in EventReason]),
        "message": short_text,
        "time": timestamps,
    }
)
memory_samples = st.fixed_dictionaries(
    {"time": seconds.map(lambda s: s / 64), "rssBytes": counts}, optional={"step": counts}
)
current_attempts = st.fixed_dictionaries(
    {"graceful": st.booleans(), "launchedTime": mostly(timestamps, st.none())},
    optional={
        "notBefore": timestamps,
        "collectiveTimeoutSeconds": st.integers(1, 600) | positive_counts,
        "recoveringSince": timestamps,
        "resumedStep": counts,
        "rollbackStep": counts,
        "restoredStep": counts,
        "firstHeartbeatTime": timestamps,
    },
)
status_parts = st.fixed_dictionaries(
    {
        "attempt": mostly(st.integers(1, 3), counts),
        "phase": mostly(
            st.sampled_from(["Running", "Recovering", "Starting"]),
            optional(st.sampled_from([str(p) for p in Phase])),
        ),
        "placed": st.lists(
            mostly(st.sampled_from(POOLS), optional(label_values)), min_size=2, max_size=2
        ),
        "kept": st.lists(mostly(st.none(), st.integers(1, 10**6)), min_size=2, max_size=2),
        "current": current_attempts,
        "memory": st.tuples(memory_samples, near(32)),
        "condition_types": condition_types,
        "foreign_conditions": st.integers(0, 2),  # 0: full of types this operator never sets
        "conditions": conditions,
        "failed_nodes": st.tuples(failed_nodes, near(c.MAX_FAILED_NODES_RECORDED)),
        "attempts": st.tuples(attempt_records, near(ATTEMPT_HISTORY_LIMIT)),
        "failures": st.tuples(failure_records, near(FAILURE_HISTORY_LIMIT)),
        "timeline": st.tuples(timeline_events, near(c.TIMELINE_LIMIT)),
        "pending": st.tuples(pending_events, near(c.TIMELINE_LIMIT)),
        "fields": st.fixed_dictionaries(
            {},
            optional={
                "observedGeneration": counts,
                "restarts": st.fixed_dictionaries(
                    {}, optional={"soft": counts, "medium": counts, "hard": counts}
                ),
                "failedNodeBudget": counts,
                "failedNodeBudgetLeft": st.integers(-5, 5) | counts,
                "lastFailure": st.fixed_dictionaries(
                    {
                        "class": st.sampled_from(["soft", "medium", "hard", "fatal"]),
                        "code": st.sampled_from(FAILURE_CODES),
                        "summary": short_text,
                    }
                ),
                "checkpointStep": counts,
                "nanRollbacks": counts,
                "skipBatches": st.sampled_from(
                    ["10:5", "10:5,20:1", "99999999999999999999:1", "x", ""]
                )
                | st.text(max_size=30),
                "progress": st.fixed_dictionaries(
                    {},
                    optional={
                        "step": counts,
                        "totalSteps": counts,
                        "stepsPerSecond": seconds,
                        "loss": st.floats(allow_nan=False, allow_infinity=False),
                    },
                ),
                "goodput": st.floats(0, 1),
                "goodputBreakdown": st.fixed_dictionaries(
                    {"wallSeconds": seconds},
                    optional={"productive": seconds, "downtime": seconds, "other": seconds},
                ),
                "startTime": timestamps,
                "completionTime": timestamps,
            },
        ),
    }
)


def raw_status(parts: Mapping[str, Any], slices: int) -> dict[str, Any]:
    """A status the CRD admits: counters up to int64, histories at their maxItems."""
    types = list(parts["condition_types"])
    if parts["foreign_conditions"] == 0:
        foreign = [f"Other{i}" for i in range(c.MAX_CONDITIONS)]
        types = list(dict.fromkeys([*types, *foreign]))[: c.MAX_CONDITIONS]
    template, length = parts["failed_nodes"]
    current = {
        **drop_none(parts["current"]),
        "placement": [
            {"slice": i, "nodePool": pool}
            for i, pool in enumerate(parts["placed"][:slices])
            if pool is not None
        ],
        "keptSlices": [
            {"slice": i, "podsAttempt": kept}
            for i, kept in enumerate(parts["kept"][:slices])
            if kept is not None
        ],
        "memorySamples": copies(*parts["memory"]),
    }
    return {
        **parts["fields"],
        "attempt": parts["attempt"],
        **drop_none({"phase": parts["phase"]}),
        "conditions": [{**parts["conditions"], "type": t} for t in types],
        "currentAttempt": current,
        "failedNodes": copies(template, length, "name"),
        "attemptHistory": copies(*parts["attempts"]),
        "failureHistory": copies(*parts["failures"]),
        "timeline": copies(*parts["timeline"]),
        "pendingEvents": copies(*parts["pending"]),
    }


RULES: list[list[dict[str, Any]] | None] = [
    None,
    [{"exitCodes": [1, 137], "class": "soft"}],
    [{"messagePattern": "(a|b)+c", "class": "hard", "code": "MY_CODE"}],
    [{"reasons": ["OOMKilled"], "class": "fatal"}],
]
BUDGETS = [0, 1, 3, c.MAX_RESTARTS]
spec_parts = st.fixed_dictionaries(
    {
        "slices": st.integers(1, 2),
        "recovery": st.fixed_dictionaries(
            {
                # An integer budget is at most half the job's hosts (the spec's own rule).
                "maxFailedNodes": st.integers(0, 1) | st.sampled_from(["0%", "20%", "50%"]),
                "autoRecovery": st.sampled_from([True, True, False]),
                "maxSoftRestarts": st.sampled_from(BUDGETS),
                "maxMediumRestarts": st.sampled_from(BUDGETS),
                "maxHardRestarts": st.sampled_from(BUDGETS),
                "maxNanRollbacks": st.integers(0, 20),
                "stallTimeoutSeconds": st.sampled_from([10, 600, c.MAX_SECONDS]),
                "backoff": st.sampled_from(
                    [{}, {"initialSeconds": 0, "maxSeconds": 0}, {"maxSeconds": c.MAX_SECONDS}]
                ),
            },
            optional={"rules": st.sampled_from(RULES[1:])},
        ),
        "spec": st.fixed_dictionaries(
            {"suspend": st.sampled_from([False] * 7 + [True])},
            # Any int64 the CRD admits.
            optional={"ttlSecondsAfterFinished": st.sampled_from([0, 60, 10**12, INT64_MAX])},
        ),
        "total_steps": optional(st.sampled_from([1, 1000, 10**12])),
        "generation": st.sampled_from([1, 2, INT64_MAX]),
    }
)


def raw_job(parts: Mapping[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    body = job_body(
        slices=parts["slices"], status=status, recovery=parts["recovery"], **parts["spec"]
    )
    if parts["total_steps"] is not None:
        body["spec"]["trainer"]["totalSteps"] = parts["total_steps"]
    body["metadata"]["generation"] = parts["generation"]
    return body


FAILED_WORKER = {
    "attempt_label": None,
    "slice_label": None,
    "worker_label": None,
    "previous": 1,
    "phase": "Failed",
    "forged": 5,
    "owner": UID,
    "node": 2,
    "pool": None,
}
world_parts = st.fixed_dictionaries(
    {
        "failing": mostly(st.just(True), st.just(False)),
        "spec": spec_parts,
        "status": status_parts,
        "pools": mostly(st.just(len(POOLS)), st.integers(0, len(POOLS))),
        "nodes": st.lists(node_parts, min_size=2 * len(POOLS), max_size=2 * len(POOLS)),
        "pods": mostly(
            st.lists(pod_parts, min_size=2, max_size=2 * HOSTS_PER_SLICE),
            st.lists(pod_parts, max_size=1),
        ),
        "lease": optional(lease_parts),
        "now": st.integers(0, 3 * 86400).map(lambda s: T0 + timedelta(seconds=s)),
        "heartbeats_seen_since": optional(moments),
    }
)


def world_of(parts: Mapping[str, Any]) -> World:
    """The raw objects of one reconcile, from the drawn parts."""
    slices = parts["spec"]["slices"]
    status = raw_status(parts["status"], slices)
    body = raw_job(parts["spec"], status)
    attempt = status["attempt"]
    names = [f"{pool}-w{w}" for pool in POOLS[: parts["pools"]] for w in range(HOSTS_PER_SLICE)]
    drawn_nodes = parts["nodes"][: len(names)]
    nodes = [
        raw_node(name, name.rsplit("-", 1)[0], p)
        for name, p in zip(names, drawn_nodes, strict=True)
    ]
    placed = {p["slice"]: p["nodePool"] for p in status["currentAttempt"]["placement"]}
    pods = {}
    logs = {}
    drawn = list(parts["pods"])
    if parts["failing"] and drawn:
        # A worker of the current attempt failed, on its slice's pool: the rest of the world
        # (its exit, its message, its log, its node, the heartbeat) is what the diagnosis,
        # the regrading and the recovery plan read.
        drawn[0] = {**drawn[0], **FAILED_WORKER}
    for p in drawn:
        pod = raw_pod(p, attempt, slices, nodes, placed)
        pods[pod["metadata"]["name"]] = pod  # names are unique
        logs[pod["metadata"]["name"]] = p["log"]
    lease = raw_lease(parts["lease"], attempt) if parts["lease"] is not None else None
    return World(
        body, list(pods.values()), nodes, lease, logs, parts["now"], parts["heartbeats_seen_since"]
    )


worlds = world_parts.map(world_of)


def observed(world: World, body: dict[str, Any]) -> Observed:
    """What a reconcile of `body` plans on, read as the operator reads it: the cache's record
    functions, `observe`, the log tails bounded and redacted as the Reader returns them."""
    cache = FakeReader(world.pods, body, world.lease, world.nodes, world.logs)
    seen = observe(cache, body)
    tails = [
        (name, redact(bounded_tail(cache.log_tail(NAMESPACE, name))))
        for name, _ in tails_to_read(seen)
    ]
    return replace(
        with_tails(seen, tails),
        tpu_short_since={},
        heartbeats_seen_since=world.heartbeats_seen_since,
    )


# ---------------------------------------------------------------------------------------------
# Regressions: what these properties found, each as plain as it can be said. Every one failed
# before its fix (a refused status, an exception, or a planner computing for ever).
# ---------------------------------------------------------------------------------------------


Check = TypeVar("Check", bound=Callable[[World], None])


def plain(body: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> World:
    """`body` on three healthy pools, planned 20 s after T0."""
    return World(body, pods or [], cluster(), None, {}, at(20), None)


def killed(body: dict[str, Any], attempt: int = 1) -> list[dict[str, Any]]:
    """The attempt's two workers, one of them killed (a soft failure)."""
    return [pod(body, attempt, 0, 0), pod(body, attempt, 0, 1, phase="Failed", exit_code=137)]


def _failed_pod_of_slice(label: str) -> dict[str, Any]:
    body = job_body(status=running_status())
    failed = pod(body, 1, 0, 0, phase="Failed", exit_code=137)
    failed["metadata"]["labels"][labels.SLICE] = label
    failed["metadata"]["name"] = f"{JOB}-1-{label}-0"  # as the operator would name it
    return failed


def _suspended_at(attempt: int) -> dict[str, Any]:
    return job_body(status={**running_status(attempt), "phase": "Suspended"})


def _message_with(**fields: Any) -> str:
    message = {"code": "COLLECTIVE_FAILURE", "exit_code": 30, "class_hint": "soft", **fields}
    return json.dumps(message)  # Python writes NaN and Infinity, and reads them back


FULL_OF_FOREIGN_CONDITIONS = job_body(
    status={"conditions": [{"type": f"Other{i}", "status": "True"} for i in range(16)]}
)
RESTARTS_SUMMING_PAST_INT64 = job_body(
    status=running_status(restarts={"soft": INT64_MAX, "medium": INT64_MAX})
)
LAST_INT64_ATTEMPT = job_body(status=running_status(INT64_MAX))
MEDIUM_RESTARTS_BY_THE_TRILLION = job_body(status=running_status(restarts={"medium": 10**12}))
TTL_PAST_THE_YEAR_9999 = job_body(
    status={"phase": "Succeeded", "attempt": 1, "completionTime": iso(T0)},
    ttlSecondsAfterFinished=INT64_MAX,
)
ONE_STEP_IN_AN_AGE = job_body(
    status={"progress": {"step": 0, "stepsPerSecond": 5e-324}},
    trainer={"image": "trainer:1", "command": ["tpujob-trainer"], "totalSteps": 10**12},
)
INFINITE_EXIT_CODE = job_body(status=running_status())

REGRESSIONS = [
    # 17 conditions: the operator's SpecValid after 16 of types it never sets.
    plain(FULL_OF_FOREIGN_CONDITIONS),
    # restarts.total, recomputed on read, past int64.
    plain(RESTARTS_SUMMING_PAST_INT64),
    # A restart (or a resume) after attempt 2**63 - 1 wrote attempt 2**63.
    plain(LAST_INT64_ATTEMPT, killed(LAST_INT64_ATTEMPT, INT64_MAX)),
    plain(_suspended_at(INT64_MAX)),
    # A soft restart computed 60 * 2 ** (medium restarts): for ever, in ever more memory.
    plain(MEDIUM_RESTARTS_BY_THE_TRILLION, killed(MEDIUM_RESTARTS_BY_THE_TRILLION)),
    # completionTime + ttl past datetime's year 9999: OverflowError.
    plain(TTL_PAST_THE_YEAR_9999),
    # The expected end of a run at 5e-324 steps per second: a timedelta overflow.
    plain(ONE_STEP_IN_AN_AGE),
    # A pod's slice label of 63 digits went into status.failureHistory[].slice.
    plain(job_body(status=running_status()), [_failed_pod_of_slice("9" * 63)]),
    # A termination message whose exit_code is Infinity: int() overflows.
    plain(
        INFINITE_EXIT_CODE,
        [
            pod(INFINITE_EXIT_CODE, 1, 0, 0),
            pod(
                INFINITE_EXIT_CODE,
                1,
                0,
                1,
                phase="Failed",
                exit_code=30,
                message=_message_with(exit_code=math.inf),
            ),
        ],
    ),
]


def found_before(test: Check) -> Check:
    """`test`, run first on every regression."""
    for world in reversed(REGRESSIONS):
        test = example(world)(test)
    return test


# ---------------------------------------------------------------------------------------------
# The properties.
# ---------------------------------------------------------------------------------------------

# A run that can fail fails the same way every time: the examples come from the test itself
# (derandomized), none from a database. TPUJOB_PROPERTY_EXAMPLES=N runs N fresh random ones
# instead, to look further than CI does.
EXPLORE = os.environ.get("TPUJOB_PROPERTY_EXAMPLES")


def over_worlds(examples: int) -> Callable[[Check], Callable[..., None]]:
    """A property of `worlds`: checked first on every regression, then on `examples` worlds.
    A planner that computes for ever fails it in two minutes, not at the suite's ten."""
    chosen = settings(
        max_examples=int(EXPLORE) if EXPLORE else examples,
        derandomize=not EXPLORE,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )

    def decorate(test: Check) -> Callable[..., None]:
        checked: Callable[..., None] = chosen(given(worlds)(found_before(test)))
        pytest.mark.timeout(120)(checked)  # a mark is stored on the test itself
        return checked

    return decorate


def test_the_validator_knows_every_keyword_of_the_status_schema() -> None:
    unknown = schema_keywords(STATUS_SCHEMA) - CHECKED_KEYWORDS - INERT_KEYWORDS
    assert unknown == set()


@pytest.mark.parametrize(
    ("case", "status"),
    [
        (
            "a condition message one character too long",
            {"conditions": [{"type": "A", "status": "True", "message": "x" * 4097}]},
        ),
        ("two conditions of one type", {"conditions": [{"type": "A", "status": "True"}] * 2}),
        ("17 conditions", {"conditions": [{"type": f"T{i}", "status": "True"} for i in range(17)]}),
        ("a negative attempt", {"attempt": -1}),
        ("an attempt past int64", {"attempt": 2**63}),
        ("an unknown phase", {"phase": "Exploded"}),
        ("an infinite goodput", {"goodput": math.inf}),
        ("a goodput above 1", {"goodput": 1.5}),
        ("a time that is not one", {"startTime": "yesterday"}),
        ("a timeline event without its time", {"timeline": [{"kind": "Failed"}]}),
    ],
)
def test_the_validator_refuses_what_the_apiserver_refuses(
    case: str, status: dict[str, Any]
) -> None:
    assert crd_violations(STATUS_SCHEMA, status) != [], case


@over_worlds(examples=250)
def test_plan_returns_for_any_input_the_cluster_can_deliver(world: World) -> None:
    assert crd_violations(STATUS_SCHEMA, world.body["status"]) == []  # an admitted status
    result = plan(observed(world, world.body), now=world.now)
    assert isinstance(result, Plan)


@over_worlds(examples=150)
def test_every_status_the_planner_writes_is_one_the_crd_accepts(world: World) -> None:
    assert crd_violations(STATUS_SCHEMA, world.body["status"]) == []  # an admitted status
    body, now = world.body, world.now
    for _ in range(3):  # each reconcile plans on the status the one before wrote
        written = assert_accepted(plan(observed(world, body), now=now).status)
        body, now = {**body, "status": written}, now + timedelta(seconds=7)
