"""From a snapshot of the cluster to findings, each with what to do. Pure.

Checks, in the order shown: the CRD and its served versions; the operator's pods; the TPU
node pools (accelerator, topology, hosts present against the hosts the topology needs, Ready,
free or busy, nodes tpujob tainted and why); the Pod Security level of the namespaces jobs run
in; when a zone catalogue is configured, whether each job's and pool's shape is offered; and
the Kueue queue of each job that names one (`tpujob.doctor.queues`).
Every input is an untrusted raw object: a malformed one becomes a finding, not a crash.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpujob.api import GROUP, PLURAL, VERSION, ConditionStatus, ConditionType, labels, topology
from tpujob.doctor.findings import Check, Finding, Level, Snapshot
from tpujob.doctor.queues import check_queues
from tpujob.gcp.catalogue import FindingLevel, check_shape

__all__ = ["CHECKS", "Check", "Finding", "Level", "Snapshot", "examine", "exit_status"]

CRD_NAME = f"{PLURAL}.{GROUP}"
OPERATOR_APP = "tpujob-operator"
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
INSTALL = "helm install tpujob-operator charts/tpujob-operator -n tpujob-system --create-namespace"
_PULL_ACTION = (
    "the image cannot be pulled: push the images to a registry the cluster can read "
    "(make release REGISTRY=REGION-docker.pkg.dev/PROJECT/REPO, from a checkout), then "
    "helm upgrade ... -f dist/values-release.yaml (and imagePullSecrets for a private "
    "registry outside the project)"
)


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def check_crd(snap: Snapshot) -> list[Finding]:
    if snap.crd is None:
        return [
            Finding(
                Check.CRD,
                Level.PROBLEM,
                CRD_NAME,
                "the TPUTrainingJob CRD is not installed",
                f"install the chart: {INSTALL}",
            )
        ]
    versions = {str(v.get("name")): v for v in _list((snap.crd.get("spec") or {}).get("versions"))}
    ours = versions.get(VERSION)
    if ours is None or not ours.get("served"):
        served = ", ".join(sorted(n for n, v in versions.items() if v.get("served"))) or "none"
        return [
            Finding(
                Check.CRD,
                Level.PROBLEM,
                CRD_NAME,
                f"version {VERSION} is not served (served: {served})",
                "upgrade the CRDs: kubectl apply --server-side --force-conflicts "
                "-f charts/tpujob-operator/crds/",
            )
        ]
    storage = next((n for n, v in versions.items() if v.get("storage")), "?")
    return [
        Finding(Check.CRD, Level.OK, CRD_NAME, f"installed; {VERSION} served, {storage} stored")
    ]


def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return status.get("phase") == "Running" and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in _list(status.get("conditions"))
    )


# What a container waiting for one of these reasons needs, in the operator chart's terms.
_WAITING_ACTIONS = {
    "ErrImagePull": _PULL_ACTION,
    "ImagePullBackOff": _PULL_ACTION,
    "InvalidImageName": _PULL_ACTION,
    "CreateContainerConfigError": "a Secret or ConfigMap the chart's values name is missing",
    "CrashLoopBackOff": "kubectl logs it --previous: the operator exits at start",
}


def _why_not_ready(pod: Mapping[str, Any]) -> tuple[str, str | None]:
    """The first container's waiting reason and message (an image that cannot be pulled is
    the usual first-install failure), or the scheduler's word; with what to do about it."""
    status = pod.get("status") or {}
    for container in _list(status.get("containerStatuses")):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason and reason != "ContainerCreating":
            message = str(waiting.get("message") or "")
            return f"{reason}" + (f" ({message[:300]})" if message else ""), _WAITING_ACTIONS.get(
                reason
            )
    for condition in _list(status.get("conditions")):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"unschedulable ({str(condition.get('message') or '')[:300]})", None
    return "", None


def check_operator(snap: Snapshot) -> list[Finding]:
    if not snap.operator_pods:
        return [
            Finding(
                Check.OPERATOR,
                Level.PROBLEM,
                OPERATOR_APP,
                f"no operator pod found (label app.kubernetes.io/name={OPERATOR_APP})",
                INSTALL,
            )
        ]
    findings = []
    for pod in snap.operator_pods:
        meta = _meta(pod)
        name = f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"
        if _pod_ready(pod):
            findings.append(Finding(Check.OPERATOR, Level.OK, name, "running and ready"))
            continue
        phase = (pod.get("status") or {}).get("phase", "Unknown")
        why, action = _why_not_ready(pod)
        findings.append(
            Finding(
                Check.OPERATOR,
                Level.PROBLEM,
                name,
                f"not ready (phase {phase})" + (f": {why}" if why else ""),
                action
                or f"kubectl -n {meta.get('namespace', '?')} describe pod "
                f"{meta.get('name', '?')}; kubectl logs it",
            )
        )
    if any(f.level is Level.OK for f in findings):
        # One healthy replica runs every job; the others are standbys.
        findings = [
            f
            if f.level is Level.OK
            else Finding(f.check, Level.WARNING, f.subject, f.message, f.action)
            for f in findings
        ]
    return findings


@dataclass(frozen=True)
class _Pool:
    name: str
    accelerator: str
    topology: str
    nodes: tuple[Mapping[str, Any], ...]


def _pools(nodes: Sequence[Mapping[str, Any]]) -> list[_Pool]:
    grouped: dict[tuple[str, str, str], list[Mapping[str, Any]]] = defaultdict(list)
    for node in nodes:
        node_labels = _str_map(_meta(node).get("labels"))
        accelerator = node_labels.get(labels.ACCELERATOR)
        if accelerator:
            key = (
                node_labels.get(labels.NODEPOOL, "(no pool label)"),
                accelerator,
                node_labels.get(labels.TOPOLOGY, "?"),
            )
            grouped[key].append(node)
    return [_Pool(p, a, t, tuple(n)) for (p, a, t), n in sorted(grouped.items())]


def _node_ready(node: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in _list((node.get("status") or {}).get("conditions"))
    )


def _tainted_by_us(node: Mapping[str, Any]) -> bool:
    return any(
        t.get("key") == labels.BAD_NODE_TAINT for t in _list((node.get("spec") or {}).get("taints"))
    )


def check_pools(snap: Snapshot) -> list[Finding]:
    pools = _pools(snap.nodes)
    if not pools:
        return [
            Finding(
                Check.NODE_POOLS,
                Level.WARNING,
                "cluster",
                f"no TPU node pools (no node labelled {labels.ACCELERATOR})",
                "create a TPU node pool (gcloud container node-pools create "
                "--machine-type ct5lp-hightpu-4t --tpu-topology 4x4 ...)",
            )
        ]
    live = [
        p
        for p in snap.tpu_pods
        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    busy_nodes = {str((p.get("spec") or {}).get("nodeName")) for p in live}
    # Nodes whose TPU pod is a job's idle one, holding the pool as its warm spare.
    spare_of = {
        str((p.get("spec") or {}).get("nodeName")): f"{_meta(p).get('namespace')}/"
        f"{_str_map(_meta(p).get('labels')).get(labels.JOB)}"
        for p in live
        if _str_map(_meta(p).get("labels")).get(labels.SPARE) == "true"
    }
    findings = []
    for pool in pools:
        try:
            shape = topology.resolve(pool.accelerator, pool.topology)
        except topology.TopologyError as err:
            findings.append(
                Finding(
                    Check.NODE_POOLS,
                    Level.WARNING,
                    pool.name,
                    str(err),
                    "jobs cannot target this pool's labels",
                )
            )
            continue
        names = sorted(str(_meta(n).get("name")) for n in pool.nodes)
        ready = sum(_node_ready(n) for n in pool.nodes)
        busy = sorted(n for n in names if n in busy_nodes)
        tainted = [n for n in pool.nodes if _tainted_by_us(n)]
        use = f"busy ({len(busy)} nodes run TPU pods)" if busy else "free"
        holders = {spare_of.get(n) for n in busy}
        if len(holders) == 1 and None not in holders:
            use = f"held as a warm spare by {holders.pop()}"
        summary = (
            f"{pool.accelerator} {pool.topology} ({shape.tpu_type}): "
            f"{len(names)}/{shape.hosts} hosts, {ready} Ready, {use}"
        )
        level, action = Level.OK, ""
        if len(names) < shape.hosts or ready < len(names):
            level, action = (
                Level.WARNING,
                "a slice needs every host Ready; check the "
                "nodes (kubectl describe node) or GKE repairs",
            )
        findings.append(Finding(Check.NODE_POOLS, level, pool.name, summary, action))
        for node in tainted:
            node_name = str(_meta(node).get("name"))
            why = _str_map(_meta(node).get("annotations")).get(
                labels.BAD_NODE_REASON, "no reason recorded"
            )
            findings.append(
                Finding(
                    Check.NODE_POOLS,
                    Level.WARNING,
                    node_name,
                    f"tainted {labels.BAD_NODE_TAINT} by tpujob: {why}",
                    f"once repaired or replaced: kubectl taint nodes {node_name} "
                    f"{labels.BAD_NODE_TAINT}-",
                )
            )
    return findings


def check_pod_security(snap: Snapshot) -> list[Finding]:
    job_namespaces = {str(_meta(j).get("namespace")) for j in snap.jobs}
    findings = []
    for ns in snap.namespaces:
        name = str(_meta(ns).get("name"))
        if job_namespaces and name not in job_namespaces:
            continue
        if not job_namespaces and name.startswith("kube-"):
            continue
        level = _str_map(_meta(ns).get("labels")).get(ENFORCE_LABEL)
        if level == "restricted":
            findings.append(
                Finding(
                    Check.POD_SECURITY,
                    Level.WARNING,
                    name,
                    "Pod Security enforce=restricted: trainer pods are refused unless their "
                    "image runs as non-root and the job meets the restricted profile",
                    f"kubectl label --dry-run=server --overwrite ns {name} "
                    f"{ENFORCE_LABEL}=baseline, then apply it if nothing else breaks",
                )
            )
        else:
            findings.append(
                Finding(
                    Check.POD_SECURITY,
                    Level.OK,
                    name,
                    f"Pod Security enforce={level or 'unset (privileged)'}",
                )
            )
    return findings


def _operator_said(jobs: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """What the operator's own catalogue said of each job's shape (its ShapeOffered condition)."""
    findings = []
    for job in jobs:
        status = job.get("status")
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        said = (
            next(
                (
                    c
                    for c in conditions
                    if isinstance(c, Mapping) and c.get("type") == ConditionType.SHAPE_OFFERED
                ),
                None,
            )
            if isinstance(conditions, list)
            else None
        )
        if said is None:
            continue
        meta = _meta(job)
        offered = said.get("status") == ConditionStatus.TRUE
        findings.append(
            Finding(
                Check.CATALOGUE,
                Level.OK if offered else Level.WARNING,
                f"job {meta.get('namespace')}/{meta.get('name')}",
                f"{said.get('message') or ''} (the operator's catalogue)",
                "" if offered else "choose a zone that offers it, or another shape",
            )
        )
    return findings


def check_catalogue(snap: Snapshot) -> list[Finding]:
    if snap.catalogue is None:
        return _operator_said(snap.jobs) or [
            Finding(
                Check.CATALOGUE,
                Level.INFO,
                "zones",
                "no zone catalogue configured",
                "pass --project and --zones to check shapes against the Cloud TPU "
                "catalogue, or give the operator one (chart values catalogue.*)",
            )
        ]
    findings = [
        Finding(
            Check.CATALOGUE,
            Level.INFO,
            zone,
            f"unreadable ({detail})",
            "grant tpu.acceleratorTypes.list or check the zone name",
        )
        for zone, (_, detail) in sorted(snap.catalogue.problems.items())
    ]
    shapes: dict[tuple[str, str], list[str]] = defaultdict(list)
    for job in snap.jobs:
        tpu = (job.get("spec") or {}).get("tpu") or {}
        meta = _meta(job)
        shapes[(str(tpu.get("accelerator")), str(tpu.get("topology")))].append(
            f"job {meta.get('namespace')}/{meta.get('name')}"
        )
    for pool in _pools(snap.nodes):
        shapes[(pool.accelerator, pool.topology)].append(f"pool {pool.name}")
    levels = {
        FindingLevel.OK: Level.OK,
        FindingLevel.INFO: Level.INFO,
        FindingLevel.WARNING: Level.WARNING,
    }
    for (accelerator, topo), users in sorted(shapes.items()):
        result = check_shape(snap.catalogue, accelerator, topo)
        findings.append(
            Finding(
                Check.CATALOGUE,
                levels[result.level],
                ", ".join(users),
                result.message,
                "choose a zone that offers it, or another shape"
                if result.level is FindingLevel.WARNING
                else "",
            )
        )
    return findings


CHECKS: tuple[tuple[Check, Callable[[Snapshot], list[Finding]]], ...] = (
    (Check.CRD, check_crd),
    (Check.OPERATOR, check_operator),
    (Check.NODE_POOLS, check_pools),
    (Check.POD_SECURITY, check_pod_security),
    (Check.CATALOGUE, check_catalogue),
    (Check.QUEUES, check_queues),
)


def examine(snap: Snapshot) -> tuple[Finding, ...]:
    """Every finding, in check order; a check whose input could not be read says so."""
    findings: list[Finding] = []
    for check, run in CHECKS:
        if check in snap.unreadable:
            findings.append(
                Finding(
                    check,
                    Level.PROBLEM,
                    str(check),
                    f"could not read: {snap.unreadable[check]}",
                    "check the kubeconfig and RBAC (kubectl auth can-i)",
                )
            )
            continue
        findings += run(snap)
    return tuple(findings)


def exit_status(findings: Sequence[Finding]) -> int:
    return 1 if any(f.level is Level.PROBLEM for f in findings) else 0
