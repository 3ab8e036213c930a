"""The measurements of hack/kubelet-fidelity.py, one function per behaviour the operator reads.

Each returns a JSON-able dict of what the node did. They run in the order of `CHECKS`; the lost
node comes last, since it takes the probe node away.
"""

from __future__ import annotations

import random
import signal
import statistics
import time
from collections.abc import Callable
from typing import Any

from fidelity_probes import (
    SLEEP,
    TERM_NOTED,
    Target,
    create,
    events,
    host_pids,
    pod_manifest,
    read,
    running,
    signal_from_host,
    summary,
    terminal,
    wait_for,
)
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

# A pod that ends by itself, and what it does.
ENDINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "exit-0": ("sys.exit(0)", {}),
    "exit-3-message": ("open('/dev/termination-log', 'w').write('probe message'); sys.exit(3)", {}),
    "exit-4-fallback-logs": (
        "print('line one'); print('last line', flush=True); sys.exit(4)",
        {"policy": "FallbackToLogsOnError"},
    ),
    "exit-5-fallback-file": (
        "print('a log line', flush=True); open('/dev/termination-log', 'w').write('from file');"
        " sys.exit(5)",
        {"policy": "FallbackToLogsOnError"},
    ),
    "oom": (
        "chunks = []\nwhile True:\n    chunks.append(bytearray(8 << 20)); time.sleep(0.02)",
        {"memory": "64Mi"},
    ),
    "sigkill-from-outside": (SLEEP, {}),
    "sigterm-from-outside": (SLEEP, {}),
}


def endings(t: Target) -> dict[str, Any]:
    """Exit codes, reasons and termination messages: a container that exits, is OOM-killed,
    or is killed from outside with SIGKILL or SIGTERM (no handler)."""
    for name, (program, options) in ENDINGS.items():
        create(t, pod_manifest(t, name, program, **options))
    signal_from_host(t, "sigkill-from-outside", signal.SIGKILL)
    signal_from_host(t, "sigterm-from-outside", signal.SIGTERM)
    out = {}
    for name in ENDINGS:
        out[name] = summary(wait_for(name, lambda n=name: terminal(t, n), 120) or read(t, name))
    return out


def start_failures(t: Target) -> dict[str, Any]:
    """Pods that cannot start as asked: an image the node does not have (imagePullPolicy
    Never), a volume mounted under /etc (a folder of the image; of the host on the agent)."""
    create(t, pod_manifest(t, "missing-image", SLEEP, image="tpujob.dev/fidelity-missing:0"))
    create(
        t,
        pod_manifest(
            t,
            "mount-under-etc",
            SLEEP,
            volumes=[{"name": "scratch", "emptyDir": {}}],
            mounts=[{"name": "scratch", "mountPath": "/etc/probe-scratch"}],
        ),
    )
    time.sleep(20)
    return {
        name: {**summary(read(t, name)), "warnings": events(t, name)[:2]}
        for name in ("missing-image", "mount-under-etc")
    }


def downward_refresh(t: Target, trials: int = 4) -> dict[str, Any]:
    """How long a changed annotation takes to reach a running pod's downward-API file (the
    operator's rejoin order travels so)."""
    name = "downward"
    program = (
        "last = None\nwhile True:\n"
        "    try: v = open('/var/run/probe/order').read()\n"
        "    except OSError: v = None\n"
        "    if v != last: note('seen', v or '-'); last = v\n"
        "    time.sleep(0.05)\n"
    )
    volume = {
        "name": "order",
        "downwardAPI": {
            "items": [
                {"path": "order", "fieldRef": {"fieldPath": "metadata.annotations['probe/order']"}}
            ]
        },
    }
    create(
        t,
        pod_manifest(
            t,
            name,
            program,
            volumes=[volume],
            mounts=[{"name": "order", "mountPath": "/var/run/probe"}],
        ),
    )
    wait_for("downward running", lambda: running(t, name), 120)
    if not wait_for("first value", lambda: t.notes(name), 60):
        return {"failed": summary(read(t, name))}
    delays: list[float] = []
    for i in range(trials):
        time.sleep(random.uniform(1, 8))  # sample different points of the kubelet's cycle
        value = f"v{i}"
        start = time.time()
        t.core.patch_namespaced_pod(
            name, t.namespace, {"metadata": {"annotations": {"probe/order": value}}}
        )
        seen = wait_for(
            f"{value} seen",
            lambda v=value: [s for w, s in t.notes(name) if w == f"seen {v}"],
            240,
            every=0.1,
        )
        delays.append(round(seen[0] - start, 2) if seen else float("inf"))
    return {"delays_s": delays, "median_s": statistics.median(delays), "max_s": max(delays)}


def _delete_and_follow(
    t: Target, name: str, grace: int | None
) -> tuple[float, dict[str, Any] | None]:
    """Delete `name`; seconds until it is gone, and its last state, as a watch (the
    operator's informer) sees them: the object of the DELETED event."""
    pod = read(t, name)
    if pod is None:
        return 0.0, None
    start = time.time()
    t.core.delete_namespaced_pod(name, t.namespace, grace_period_seconds=grace)
    for event in watch.Watch().stream(
        t.core.list_namespaced_pod,
        t.namespace,
        field_selector=f"metadata.name={name}",
        resource_version=pod["metadata"]["resourceVersion"],
        timeout_seconds=120,
    ):
        if event["type"] == "DELETED":
            gone = round(time.time() - start, 2)
            return gone, dict(t.core.api_client.sanitize_for_serialization(event["object"]))
    return float("inf"), read(t, name)


def grace_and_sigterm(t: Target) -> dict[str, Any]:
    """A deleted pod: when SIGTERM comes, when the pod is gone, with a program that ignores it
    (killed at the end of the grace period) and one that exits 0 on it."""
    programs = {
        "grace-ignores-term": TERM_NOTED + SLEEP,
        "grace-exits-on-term": "\nsignal.signal(signal.SIGTERM, lambda *_: (note('TERM'),"
        " time.sleep(1), sys.exit(0)))\n" + SLEEP,
    }
    for name, program in programs.items():
        create(t, pod_manifest(t, name, program, grace=8))
    out = {}
    for name in programs:
        wait_for(f"{name} running", lambda n=name: running(t, n), 120)
        time.sleep(2)  # the handler is installed once the program runs
        start = time.time()
        gone_after, last = _delete_and_follow(t, name, None)
        terms = [round(s - start, 2) for w, s in t.notes(name) if w == "TERM"]
        out[name] = {
            "grace_s": 8,
            "sigterm_after_s": terms,
            "gone_after_s": gone_after,
            "last_status": summary(last),
        }
    return out


def force_delete(t: Target) -> dict[str, Any]:
    """`kubectl delete --force --grace-period=0` of a running pod that ignores SIGTERM: the
    API object goes at once; how long its process lives on, and whether it saw SIGTERM."""
    name = "force-delete"
    create(t, pod_manifest(t, name, TERM_NOTED + SLEEP, grace=30))
    wait_for(f"{name} running", lambda: running(t, name), 120)
    time.sleep(2)
    start = time.time()
    gone_after, _ = _delete_and_follow(t, name, 0)
    ended = wait_for("process end", lambda: not host_pids(t.marker(name)), 90, every=0.1)
    return {
        "api_object_gone_after_s": gone_after,
        "process_ended_after_s": round(time.time() - start, 2) if ended else None,
        "sigterm_after_s": [round(s - start, 2) for w, s in t.notes(name) if w == "TERM"],
    }


# PersistentVolume hostPath types, each with a folder that does not exist yet.
PV_TYPES = {
    "pv-directory-or-create": "DirectoryOrCreate",
    "pv-untyped": "",
    "pv-directory": "Directory",
}


def pv_host_path(t: Target) -> dict[str, Any]:
    """A claim bound to a hostPath PersistentVolume whose folder does not exist yet."""
    for name, kind in PV_TYPES.items():
        pv = f"{t.namespace}-{name}"
        host_path: dict[str, Any] = {"path": f"/tmp/tpujob-fidelity/{t.run}/{name}/data"}
        if kind:
            host_path["type"] = kind
        t.core.create_persistent_volume(
            {
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Mi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "hostPath": host_path,
                    "claimRef": {"namespace": t.namespace, "name": name},
                },
            }
        )
        t.core.create_namespaced_persistent_volume_claim(
            t.namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Mi"}},
                },
            },
        )
        create(
            t,
            pod_manifest(
                t,
                name,
                "open('/data/file', 'w').write('ok'); sys.exit(0)",
                volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
                mounts=[{"name": "data", "mountPath": "/data"}],
            ),
        )
    out = {}
    for name in PV_TYPES:
        pod = wait_for(name, lambda n=name: terminal(t, n), 45)
        out[name] = {**summary(pod or read(t, name)), "warnings": events(t, name)[:2]}
    return out


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def lost_node(t: Target) -> dict[str, Any]:
    """The probe node goes away (its host stops): what its pods show, force-deleting one
    stuck terminating, and what a pod kept through it shows once the node is back."""
    evicted = [
        {"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute"}
        for k in ("unreachable", "not-ready")
    ]
    create(
        t,
        pod_manifest(
            t, "lost-evicted", SLEEP, tolerations=[{**e, "tolerationSeconds": 15} for e in evicted]
        ),
    )
    create(
        t,
        pod_manifest(
            t, "lost-kept", SLEEP, tolerations=[{**e, "tolerationSeconds": 3600} for e in evicted]
        ),
    )
    for name in ("lost-evicted", "lost-kept"):
        wait_for(f"{name} running", lambda n=name: running(t, n), 120)
    out: dict[str, Any] = {}
    start = time.time()
    t.node_down()

    def node_ready() -> dict[str, Any]:
        return _condition(
            t.core.api_client.sanitize_for_serialization(t.core.read_node(t.node)), "Ready"
        )

    def since() -> float:
        return round(time.time() - start, 1)

    wait_for("node not Ready", lambda: node_ready().get("status") != "True", 300, every=0.5)
    out["node_ready_after_s"] = since()
    out["node_ready"] = {k: node_ready().get(k) for k in ("status", "reason")}
    wait_for(
        "pod not Ready",
        lambda: _condition(read(t, "lost-kept"), "Ready").get("status") == "False",
        120,
    )
    out["pod_not_ready_after_s"] = since()
    wait_for(
        "eviction",
        lambda: (read(t, "lost-evicted") or {}).get("metadata", {}).get("deletionTimestamp"),
        120,
    )
    out["evicted_after_s"] = since()
    time.sleep(10)
    out["evicted_pod"] = summary(read(t, "lost-evicted"))
    out["kept_pod"] = summary(read(t, "lost-kept"))
    start_force = time.time()
    gone_after, _ = _delete_and_follow(t, "lost-evicted", 0)
    out["force_delete_on_lost_node_s"] = gone_after if gone_after < 120 else None
    del start_force
    start = time.time()
    t.node_up()
    wait_for("node Ready again", lambda: node_ready().get("status") == "True", 300, every=0.5)
    out["node_back_after_s"] = since()
    kept = wait_for("kept pod ends", lambda: terminal(t, "lost-kept"), 180)
    out["kept_pod_after_node_back_s"] = since() if kept else None
    out["kept_pod_after_node_back"] = summary(kept or read(t, "lost-kept"))
    return out


CHECKS: dict[str, Callable[[Target], dict[str, Any]]] = {
    "endings": endings,
    "start_failures": start_failures,
    "downward_refresh": downward_refresh,
    "grace_and_sigterm": grace_and_sigterm,
    "force_delete": force_delete,
    "pv_host_path": pv_host_path,
    "lost_node": lost_node,
}


def cleanup_volumes(t: Target) -> None:
    for name in PV_TYPES:
        try:
            t.core.delete_persistent_volume(f"{t.namespace}-{name}")
        except ApiException as err:
            if err.status != 404:
                raise
