"""Builders of jobs, pods, nodes and heartbeats as the API server returns them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from tpujob.api import GROUP, KIND, VERSION, contract, labels, parse_job
from tpujob.observed.views import Observed, heartbeat_view, node_view, pod_view, with_reports
from tpujob.plan import manifests
from tpujob.plan.placement import pools_of

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def iso(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def job_body(
    *,
    slices: int = 1,
    status: dict[str, Any] | None = None,
    recovery: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": "tpujob.dev/v1alpha1",
        "kind": "TPUTrainingJob",
        "metadata": {
            "name": "train",
            "namespace": "team",
            "uid": "job-uid",
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": {
            "framework": "jax",
            "tpu": {"accelerator": "tpu-v4-podslice", "topology": "2x2x2", "slices": slices},
            "trainer": {"image": "trainer:1", "command": ["tpujob-trainer"]},
            "checkpoint": {"uri": "gs://bucket/ckpt"},
            "recovery": {"maxFailedNodes": 1, **(recovery or {})},
            **spec,
        },
        "status": status or {},
    }


def node(
    name: str,
    pool: str,
    *,
    ready: str = "True",
    taints: tuple[str, ...] = (),
    tpu: int = 4,
    tpu_unhealthy: bool = False,
    node_labels: dict[str, str] | None = None,
    uid: str | None = None,
    unschedulable: bool = False,
    ready_since: datetime | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    ready_condition = {"type": "Ready", "status": ready}
    if ready_since is not None:
        ready_condition["lastTransitionTime"] = iso(ready_since)
    conditions = [ready_condition]
    return {
        "metadata": {
            "name": name,
            "uid": uid or f"uid-{name}",
            "annotations": annotations or {},
            "labels": {
                labels.NODEPOOL: pool,
                labels.ACCELERATOR: "tpu-v4-podslice",
                labels.TOPOLOGY: "2x2x2",
                **(node_labels or {}),
            },
        },
        "spec": {
            "taints": [{"key": t, "effect": "NoSchedule"} for t in taints],
            "unschedulable": unschedulable,
        },
        "status": {
            "conditions": conditions,
            "capacity": {labels.TPU_RESOURCE: "4"},
            "allocatable": {labels.TPU_RESOURCE: "0" if tpu_unhealthy else str(tpu)},
        },
    }


def cluster(pools: int = 3, **overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """`pools` healthy two-host pools; `overrides` maps a node name to node() keyword args."""
    nodes = []
    for p in range(pools):
        for w in range(2):
            name = f"pool-{p}-w{w}"
            nodes.append(node(name, f"pool-{p}", **overrides.get(name, {})))
    return nodes


def pod(
    job: dict[str, Any],
    attempt: int,
    slice_index: int,
    worker: int,
    *,
    phase: str = "Running",
    node_name: str | None = None,
    exit_code: int | None = None,
    message: str = "",
    reason: str | None = None,
    finished: float = 10.0,
    deleting: float | None = None,
    disruption: str | None = None,
) -> dict[str, Any]:
    parsed = parse_job(job)
    manifest = manifests.trainer_pod(
        parsed,
        manifests.AttemptSettings(attempt=attempt, pools=pools_of(parsed.status.current_attempt)),
        slice_index,
        worker,
    )
    manifest["metadata"]["uid"] = f"uid-{attempt}-{slice_index}-{worker}"
    manifest["metadata"]["creationTimestamp"] = iso(T0)
    if deleting is not None:
        manifest["metadata"]["deletionTimestamp"] = iso(at(deleting))
    manifest["spec"]["nodeName"] = node_name or f"pool-{slice_index}-w{worker}"
    state: dict[str, Any] = {"running": {"startedAt": iso(T0)}}
    if phase in ("Failed", "Succeeded"):
        state = {
            "terminated": {
                "exitCode": exit_code
                if exit_code is not None
                else (0 if phase == "Succeeded" else 1),
                "reason": reason or ("Completed" if phase == "Succeeded" else "Error"),
                "message": message,
                "finishedAt": iso(at(finished)),
            }
        }
    conditions = []
    if disruption:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption})
    manifest["status"] = {
        "phase": phase,
        "conditions": conditions,
        "containerStatuses": [{"name": "trainer", "state": state}],
    }
    return manifest


def refused(
    manifest: dict[str, Any], message: str, *, since: float | None = None
) -> dict[str, Any]:
    """`manifest` (a pod) as one the scheduler could not place, saying `message`, since `since`."""
    manifest["spec"].pop("nodeName", None)
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
    }
    if since is not None:
        condition["lastTransitionTime"] = iso(at(since))
    manifest["status"] = {"phase": "Pending", "conditions": [condition]}
    return manifest


def trainer_message(code: contract.ExitCode, summary: str, step: int | None = 30) -> str:
    info = contract.EXIT_CODES[code]
    return contract.encode_termination_message(
        contract.TerminationMessage(
            code=info.code, exit_code=int(code), class_hint=info.hint, summary=summary, step=step
        )
    )


def lease_owner(job: str = "train", uid: str = "uid-train") -> list[dict[str, Any]]:
    """The owner reference the operator writes on job `job`'s heartbeat Lease."""
    return [{"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": job, "uid": uid}]


def lease(
    *, renewed: float, step: int | None = None, attempt: int = 1, sps: float = 2.0
) -> dict[str, Any]:
    notes = {
        contract.HEARTBEAT_ATTEMPT: str(attempt),
        contract.HEARTBEAT_STEPS_PER_SECOND: str(sps),
    }
    if step is not None:
        notes[contract.HEARTBEAT_STEP] = str(step)
        notes[contract.HEARTBEAT_CHECKPOINT_STEP] = str(step - step % 10)
    return {"metadata": {"annotations": notes}, "spec": {"renewTime": iso(at(renewed))}}


def observed(
    job: dict[str, Any],
    pods: list[dict[str, Any]] | None = None,
    nodes: list[dict[str, Any]] | None = None,
    heartbeat: dict[str, Any] | None = None,
    logs: dict[str, str] | None = None,
) -> Observed:
    parsed, beat = parse_job(job), heartbeat_view(heartbeat)
    return Observed(
        job=parsed,
        pods=with_reports(
            [pod_view(p) for p in pods or []],
            beat,
            parsed.status.attempt,
            str(parsed.metadata.get("uid", "")),
        ),
        nodes={n["metadata"]["name"]: node_view(n) for n in (nodes or cluster())},
        heartbeat=beat,
        log_tails=logs or {},
    )


def reported(
    body: dict[str, Any],
    slice_index: int,
    worker: int,
    *,
    exit_code: int = 137,
    at_seconds: float = 10.0,
    attempt: int = 1,
    job_uid: str = "job-uid",
    message: str = "",
    reason: str = "Error",
) -> dict[str, Any]:
    """`body` (a Lease) with a supervisor's report that worker (`slice_index`, `worker`)'s
    training process ended with `exit_code` at `at_seconds`."""
    report = contract.FailureReport(
        attempt=attempt,
        job_uid=job_uid,
        exit_code=exit_code,
        signal=exit_code - 128 if exit_code > 128 else None,
        reason=reason,
        message=message,
        at=iso(at(at_seconds)),
    )
    key = contract.failure_annotation(slice_index, worker)
    body["metadata"]["annotations"][key] = contract.encode_failure_report(report)
    return body


def running_status(
    attempt: int = 1, pools: tuple[str, ...] = ("pool-0",), **extra: Any
) -> dict[str, Any]:
    return {
        "phase": "Running",
        "attempt": attempt,
        "startTime": iso(T0),
        "currentAttempt": {
            "placement": [{"slice": i, "nodePool": p} for i, p in enumerate(pools)],
            "launchedTime": iso(T0),
        },
        **extra,
    }


def message_json(text: str) -> dict[str, Any]:
    return dict(json.loads(text))
