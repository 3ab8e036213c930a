"""What the operator observed of one job, as frozen values built from raw API objects.

Pure: parsing only. The adapter layer (`tpujob.kube`) fetches the raw objects; the planner
reads these views and never a raw dict, so what a decision depended on is visible in one place.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tpujob.api import TPUTrainingJob, contract, labels
from tpujob.api import constants as c
from tpujob.diagnosis.site import SiteRule
from tpujob.gcp.catalogue import Catalogue

if TYPE_CHECKING:
    from tpujob.observed.admission import WorkloadView


def parse_time(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = str(value).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class PodView:
    """One trainer pod of the job."""

    name: str
    uid: str
    attempt: int
    slice: int
    worker: int
    node: str | None
    phase: str
    created: datetime | None
    deleting_since: datetime | None = None
    running: bool = False
    running_since: datetime | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    disruption_reason: str | None = None
    unschedulable_message: str | None = None
    # lastTransitionTime of PodScheduled=False: since when the scheduler has not placed it.
    unschedulable_since: datetime | None = None
    node_pool: str | None = None
    # IDs of the worker's google.com/tpu devices the kubelet reports Unhealthy in
    # status.containerStatuses[].allocatedResourcesStatus (KEP-4680; beta, on by default,
    # from Kubernetes v1.36).
    unhealthy_devices: tuple[str, ...] = ()
    # How its training process ended while the pod lives on, as its supervisor reported it on
    # the heartbeat Lease for the pod's attempt (`with_reports`); None: no report.
    reported: contract.FailureReport | None = None
    # One of the idle pods holding a warm spare pool (`labels.SPARE`), not a trainer.
    spare: bool = False
    # Why its container has not started yet (its waiting state), while it has not.
    waiting_reason: str | None = None
    waiting_message: str = ""
    # lastTransitionTime of PodScheduled=True: since when it has been on its node.
    scheduled_since: datetime | None = None
    # How its running container's previous run ended (lastState.terminated), after a restart
    # in the pod: what a supervisor restarted after a kill reports on the Lease points here.
    last_reason: str | None = None
    last_message: str = ""

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"


# More hosts than any TPU slice has (the largest has 1536).
MAX_WORKER = 100_000
# A waiting state's reason is one CamelCase word of the kubelet's; anything longer is not one.
MAX_REASON = 128


def pod_view(raw: Mapping[str, Any]) -> PodView:
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    pod_labels = meta.get("labels") or {}
    terminated: Mapping[str, Any] = {}
    waiting: Mapping[str, Any] = {}
    running = False
    running_since: datetime | None = None
    last: Mapping[str, Any] = {}
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        before = (cs.get("lastState") or {}).get("terminated")
        if "running" in state and isinstance(before, Mapping) and not last:
            last = before
        if "terminated" in state:
            terminated = failure_end(state["terminated"], cs.get("lastState"))
        if isinstance(state.get("waiting"), Mapping) and not waiting:
            waiting = state["waiting"]
        if "running" in state:
            running = True
            since = parse_time(state["running"].get("startedAt"))
            if since is not None and (running_since is None or since > running_since):
                running_since = since
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    disruption = conditions.get("DisruptionTarget")
    scheduled = conditions.get("PodScheduled")
    unschedulable, unschedulable_since, scheduled_since = None, None, None
    if scheduled and scheduled.get("status") == "False":
        unschedulable = scheduled.get("message") or scheduled.get("reason") or "unschedulable"
        unschedulable_since = parse_time(scheduled.get("lastTransitionTime"))
    elif scheduled and scheduled.get("status") == "True":
        scheduled_since = parse_time(scheduled.get("lastTransitionTime"))
    return PodView(
        name=meta["name"],
        uid=meta.get("uid", ""),
        # Labels are free to write: a number past any the operator gives (past any the status
        # can hold, for the attempt) is read as 0, as a label that is no number is, never as a
        # value a status field cannot hold.
        attempt=_bounded_int(pod_labels.get(labels.ATTEMPT), 0, contract.MAX_COUNT) or 0,
        slice=_bounded_int(pod_labels.get(labels.SLICE), 0, c.MAX_SLICES) or 0,
        worker=_bounded_int(pod_labels.get(labels.WORKER), 0, MAX_WORKER) or 0,
        node=spec.get("nodeName"),
        phase=status.get("phase") or "Pending",
        created=parse_time(meta.get("creationTimestamp")),
        deleting_since=parse_time(meta.get("deletionTimestamp")),
        running=running,
        running_since=running_since,
        exit_code=_int(terminated.get("exitCode")),
        signal=_int(terminated.get("signal")),
        reason=terminated.get("reason"),
        message=str(terminated.get("message") or status.get("message") or ""),
        started_at=parse_time(terminated.get("startedAt")),
        finished_at=parse_time(terminated.get("finishedAt")),
        disruption_reason=(disruption or {}).get("reason")
        if (disruption or {}).get("status") == "True"
        else None,
        unschedulable_message=unschedulable,
        unschedulable_since=unschedulable_since,
        node_pool=(spec.get("nodeSelector") or {}).get(labels.NODEPOOL),
        unhealthy_devices=unhealthy_devices(status),
        spare=pod_labels.get(labels.SPARE) == "true",
        waiting_reason=str(waiting.get("reason") or "")[:MAX_REASON] or None,
        waiting_message=str(waiting.get("message") or "")[: c.MAX_MESSAGE_LENGTH],
        scheduled_since=scheduled_since,
        last_reason=str(last.get("reason") or "")[:MAX_REASON] or None,
        last_message=str(last.get("message") or "")[: c.MAX_MESSAGE_LENGTH],
    )


def failure_end(terminated: Mapping[str, Any], last: Any) -> Mapping[str, Any]:
    """The end of a container that tells its failure. A trainer's supervisor restarted in its
    pod after it had passed a SIGKILL on ends at once with `ExitCode.ENDED_AFTER_KILL`
    (`tpujob_trainer.rejoin`): the end before it (lastState) is the failure, with its reason
    (OOMKilled, say) and message."""
    if _int(terminated.get("exitCode")) != contract.ExitCode.ENDED_AFTER_KILL:
        return terminated
    previous = last.get("terminated") if isinstance(last, Mapping) else None
    return previous if isinstance(previous, Mapping) and previous else terminated


def unhealthy_devices(status: Mapping[str, Any]) -> tuple[str, ...]:
    """google.com/tpu device IDs reported Unhealthy by any container of the pod.

    Only `Unhealthy` counts: `Unknown` means the device plugin could not tell, which is no
    evidence against the chip.
    """
    found: list[str] = []
    for cs in _dicts(status.get("containerStatuses")):
        for resource in _dicts(cs.get("allocatedResourcesStatus")):
            if resource.get("name") != labels.TPU_RESOURCE:
                continue
            for device in _dicts(resource.get("resources")):
                device_id = str(device.get("resourceID") or "")
                if device.get("health") == "Unhealthy" and device_id not in found:
                    found.append(device_id)
    return tuple(found)


def _dicts(value: Any) -> list[Mapping[str, Any]]:
    """The mappings in a list field of an untrusted object; anything else is ignored."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


@dataclass(frozen=True)
class NodeView:
    """A node as it shows now, parsed and not judged.

    What its readings mean (down now, under maintenance, TPUs short, placeable, lost for good)
    is decided in one place, `tpujob.observed.nodes`, which every reader asks.
    """

    name: str
    pool: str | None
    accelerator: str | None
    topology: str | None
    ready: str  # "True", "False" or "Unknown"
    taints: tuple[tuple[str, str], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    tpu_capacity: int = 0
    tpu_allocatable: int = 0
    unschedulable: bool = False
    # lastTransitionTime of the Ready condition: since when `ready` has held.
    ready_since: datetime | None = None
    uid: str = ""
    # The tpujob.dev/unhealthy-reason annotation: which job marked the node bad, and why.
    mark_reason: str | None = None

    def has_taint(self, key: str, effect: str | None = None) -> bool:
        return any(k == key and effect in (None, e) for k, e in self.taints)

    @property
    def scheduled_maintenance(self) -> str | None:
        """GKE's scheduled-maintenance-time label (Unix seconds), unparsed."""
        return self.labels.get(labels.SCHEDULED_MAINTENANCE_LABEL)


def node_view(raw: Mapping[str, Any]) -> NodeView:
    meta, spec, status = raw["metadata"], raw.get("spec") or {}, raw.get("status") or {}
    node_labels = meta.get("labels") or {}
    conditions = {c.get("type"): c for c in _dicts(status.get("conditions"))}
    ready = conditions.get("Ready") or {}
    return NodeView(
        name=meta["name"],
        pool=node_labels.get(labels.NODEPOOL),
        accelerator=node_labels.get(labels.ACCELERATOR),
        topology=node_labels.get(labels.TOPOLOGY),
        ready=str(ready.get("status", "Unknown")),
        taints=tuple(
            (str(t.get("key", "")), str(t.get("effect", ""))) for t in _dicts(spec.get("taints"))
        ),
        labels={str(k): str(v) for k, v in node_labels.items()},
        tpu_capacity=_int((status.get("capacity") or {}).get(labels.TPU_RESOURCE)) or 0,
        tpu_allocatable=_int((status.get("allocatable") or {}).get(labels.TPU_RESOURCE)) or 0,
        unschedulable=bool(spec.get("unschedulable")),
        ready_since=parse_time(ready.get("lastTransitionTime")),
        uid=str(meta.get("uid") or ""),
        mark_reason=_str((meta.get("annotations") or {}).get(labels.BAD_NODE_REASON)),
    )


@dataclass(frozen=True)
class Heartbeat:
    """Worker 0's heartbeat Lease."""

    renewed: datetime | None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    steps_per_second: float | None = None
    checkpoint_step: int | None = None
    attempt: int | None = None
    # The trainer runs under the supervisor that restarts it in place on a rejoin order.
    rejoins: bool = False
    # Seconds a save holds the training loop up (the attempt's mean); None before its first.
    save_seconds: float | None = None
    # The uid of the job whose trainer wrote the beat; None from a trainer that does not say.
    job_uid: str | None = None
    # When this operator first saw this renewal, by its own clock (`renewed` is the trainer's,
    # and a trainer host's clock may be off: 11 s slow makes every beat look stale at the
    # shortest stall timeout, fast makes a hang look fresh). None: not witnessed.
    seen: datetime | None = None
    # The health numbers' annotations (`HEALTH_ANNOTATIONS`, bounded; untrusted text).
    annotations: Mapping[str, str] = field(default_factory=dict)
    # The supervisors' reports of ended training processes, by (slice, worker).
    failures: Mapping[tuple[int, int], contract.FailureReport] = field(default_factory=dict)


# The trainer writes the heartbeat, and anyone who can patch the Lease can too: a number out
# of these ranges is absent evidence, never a crash of the planner or a status the API refuses.
MAX_STEP = 10**12
MAX_STEPS_PER_SECOND = 1e6
MAX_SAVE_SECONDS = 86400.0
# The annotations the health numbers are read from (`tpujob.observed.training.parse_health`):
# the only ones kept, each bounded, so a Lease's 256 KiB of annotations are not all cached.
# A per-worker list of the largest slices (1,536 hosts, 12 characters each) fits.
HEALTH_ANNOTATIONS = (
    contract.HEARTBEAT_HEALTH_STEP,
    contract.HEARTBEAT_INPUT_BOUND_FRACTION,
    contract.HEARTBEAT_WORKER_INPUT_BOUND,
    contract.HEARTBEAT_WORKER_STEP_SECONDS,
    contract.HEARTBEAT_WORKER_RSS_BYTES,
)
MAX_HEALTH_CHARS = 24 * 1024


def _bounded_int(value: Any, low: int, high: int) -> int | None:
    number = _int(value)
    return number if number is not None and low <= number <= high else None


def heartbeat_view(raw: Mapping[str, Any] | None) -> Heartbeat | None:
    if raw is None:
        return None
    notes = (raw.get("metadata") or {}).get("annotations") or {}

    def number(key: str, low: float, high: float) -> float | None:
        try:
            value = float(notes[key])
        except (KeyError, TypeError, ValueError):
            return None
        return value if math.isfinite(value) and low <= value <= high else None

    return Heartbeat(
        renewed=parse_time((raw.get("spec") or {}).get("renewTime")),
        step=_bounded_int(notes.get(contract.HEARTBEAT_STEP), 0, MAX_STEP),
        total_steps=_bounded_int(notes.get(contract.HEARTBEAT_TOTAL_STEPS), 1, MAX_STEP),
        loss=number(contract.HEARTBEAT_LOSS, -math.inf, math.inf),
        steps_per_second=number(contract.HEARTBEAT_STEPS_PER_SECOND, 0.0, MAX_STEPS_PER_SECOND),
        checkpoint_step=_bounded_int(notes.get(contract.HEARTBEAT_CHECKPOINT_STEP), 0, MAX_STEP),
        attempt=_bounded_int(notes.get(contract.HEARTBEAT_ATTEMPT), 1, c.MAX_ATTEMPT),
        rejoins=notes.get(contract.HEARTBEAT_REJOINS) == "true",
        save_seconds=number(contract.HEARTBEAT_SAVE_SECONDS, 0.0, MAX_SAVE_SECONDS),
        job_uid=_str(notes.get(contract.HEARTBEAT_JOB_UID)),
        annotations={
            key: value[:MAX_HEALTH_CHARS]
            for key in HEALTH_ANNOTATIONS
            if isinstance(value := notes.get(key), str)
        },
        failures=failure_reports(notes),
    )


def failure_reports(notes: Mapping[str, Any]) -> dict[tuple[int, int], contract.FailureReport]:
    """The supervisors' failure reports among a Lease's annotations. Anyone who may patch the
    Lease may write one: each is parsed bounded, and only keys naming a worker count."""
    found: dict[tuple[int, int], contract.FailureReport] = {}
    for key, value in notes.items():
        if not isinstance(key, str) or not key.startswith(contract.LEASE_FAILURE_PREFIX):
            continue
        slice_text, _, worker_text = key[len(contract.LEASE_FAILURE_PREFIX) :].partition("-")
        at_slice = _bounded_int(slice_text, 0, c.MAX_SLICES)
        worker = _bounded_int(worker_text, 0, MAX_WORKER)
        report = contract.parse_failure_report(value if isinstance(value, str) else None)
        if at_slice is not None and worker is not None and report is not None:
            found[(at_slice, worker)] = report
    return found


def with_reports(
    pods: Sequence[PodView], beat: Heartbeat | None, attempt: int, job_uid: str
) -> tuple[PodView, ...]:
    """`pods` with the failure their supervisor reported for the current `attempt`, on those
    that still run (a pod that ended has the kubelet's own record, which wins)."""
    if beat is None or not beat.failures:
        return tuple(pods)
    out = []
    for pod in pods:
        report = beat.failures.get((pod.slice, pod.worker))
        if (
            report is not None
            and pod.attempt == attempt
            and report.attempt == attempt
            and report.job_uid == job_uid
            and pod.running
            and not pod.terminal
        ):
            out.append(replace(pod, reported=report))
        else:
            out.append(pod)
    return tuple(out)


def own_heartbeat(beat: Heartbeat | None, job_uid: str) -> Heartbeat | None:
    """`beat` when the job `job_uid` may count it: a beat signed by another job is a leftover
    trainer of an earlier job of the same name (its pods orphaned, not yet fenced), whose
    renewals would otherwise pass for this job's first beat and its steps for this job's."""
    if beat is None or beat.job_uid is None or not job_uid or beat.job_uid == job_uid:
        return beat
    return None


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile of one job looked at."""

    job: TPUTrainingJob
    pods: tuple[PodView, ...]
    nodes: Mapping[str, NodeView]
    heartbeat: Heartbeat | None
    # TPU chips requested on each pool by pods of other jobs (placement avoids busy pools).
    busy_pools: frozenset[str] = frozenset()
    log_tails: Mapping[str, str] = field(default_factory=dict)
    # When this operator first saw each node's allocatable google.com/tpu below capacity
    # (`tpujob.observed.nodes.note_tpu_shortfall`). The node object carries no time for it.
    # None: the caller keeps no such record, and a shortfall counts as soon as it is seen.
    tpu_short_since: Mapping[str, datetime] | None = None
    # The Cloud TPU zone catalogue, when the operator is given one (advice only).
    catalogue: Catalogue | None = None
    # Since when the operator has reached the API server, and watched the heartbeat Leases,
    # without a break, as its shell recorded it. While the API is down no trainer can renew its
    # heartbeat, and while the watch is down no operator can see one renewed, so a heartbeat's
    # age counts only from then (`tpujob.observed.trouble`). None: no record is kept, and the
    # age counts in full.
    heartbeats_seen_since: datetime | None = None
    # The node ledger's rows, (node, "namespace/job", seconds since the epoch): soft blames
    # of nodes by all the operator's jobs (`tpujob.plan.node_ledger`).
    node_blames: tuple[tuple[str, str, float], ...] = ()
    # The cluster's site rules (`tpujob.diagnosis.site`), as the operator last read them.
    site_rules: tuple[SiteRule, ...] = ()
    # The idle pods holding the job's warm spare pools (`tpujob.plan.spares`); never in `pods`.
    spares: tuple[PodView, ...] = ()
    # Whether the operator runs its Kueue integration, and the job's Workload when it has one
    # (`tpujob.observed.admission`, `tpujob.plan.queueing`).
    queueing: bool = False
    workload: WorkloadView | None = None

    def attempt_pods(self, attempt: int) -> tuple[PodView, ...]:
        return tuple(p for p in self.pods if p.attempt == attempt)
