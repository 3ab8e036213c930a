"""The probes of hack/kubelet-fidelity.py: pods that exercise one kubelet behaviour each.

Each probe runs a small Python program in a pod bound to one node (`nodeName`, so the
scheduler plays no part) and returns what the node reported, as plain JSON: the pod's phase,
conditions and container states, and timings measured here. The programs note what they see
(a signal, a changed file) with a timestamp in a file of a hostPath folder, read back through
the target's `read_node_file`, so a note survives the pod's deletion. Times are wall-clock
seconds of this machine, which the kind nodes share.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

PROBE_DIR = "/tmp/tpujob-fidelity"
TERMINAL = ("Succeeded", "Failed")

# Runs first in every probe container: `note(...)` appends a timestamped line to this pod's
# file; argv[1] is the pod's marker, which also finds its process from the host.
PRELUDE = """
import os, signal, sys, time
NAME = sys.argv[1]
def note(*words):
    with open("/probe/" + NAME, "a") as f:
        f.write(" ".join(map(str, words)) + " %.3f\\n" % time.time())
"""
SLEEP = "\nwhile True: time.sleep(1)\n"
TERM_NOTED = "\nsignal.signal(signal.SIGTERM, lambda *_: note('TERM'))\n"


@dataclass
class Target:
    """One cluster to measure: where it is and how to act on its node from outside."""

    name: str
    core: client.CoreV1Api
    node: str
    image: str
    run: str  # unique per run: names the namespace, the probe folder and the markers
    read_node_file: Callable[[str], str]  # a file of the node's file system ("" if absent)
    node_down: Callable[[], None]
    node_up: Callable[[], None]

    @property
    def namespace(self) -> str:
        return f"fidelity-{self.run}"

    def marker(self, pod: str) -> str:
        return f"fidelity-{self.run}-{pod}"

    def notes(self, pod: str) -> list[tuple[str, float]]:
        """The lines `note(...)` wrote for `pod`: (words, time)."""
        text = self.read_node_file(f"{PROBE_DIR}/{self.run}/{self.marker(pod)}")
        out = []
        for line in text.splitlines():
            words, _, stamp = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out.append((words, float(stamp)))
        return out


def pod_manifest(
    t: Target,
    name: str,
    program: str,
    *,
    grace: int | None = None,
    memory: str | None = None,
    policy: str = "File",
    image: str | None = None,
    volumes: list[dict[str, Any]] | None = None,
    mounts: list[dict[str, Any]] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "probe",
        "image": image or t.image,
        "imagePullPolicy": "Never",  # nothing is pulled: kind's images are loaded beforehand
        "command": ["python3", "-c", PRELUDE + program, t.marker(name)],
        "terminationMessagePolicy": policy,
        "securityContext": {"runAsUser": 0},  # writes the root-owned hostPath folder
        "volumeMounts": [{"name": "probe", "mountPath": "/probe"}, *(mounts or [])],
    }
    if memory:
        container["resources"] = {"limits": {"memory": memory}, "requests": {"memory": memory}}
    spec: dict[str, Any] = {
        "nodeName": t.node,
        "restartPolicy": "Never",
        "containers": [container],
        "volumes": [
            {
                "name": "probe",
                "hostPath": {"path": f"{PROBE_DIR}/{t.run}", "type": "DirectoryOrCreate"},
            },
            *(volumes or []),
        ],
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(t: Target, manifest: dict[str, Any]) -> None:
    t.core.create_namespaced_pod(t.namespace, manifest)


def read(t: Target, name: str) -> dict[str, Any] | None:
    try:
        pod = t.core.read_namespaced_pod(name, t.namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return dict(t.core.api_client.sanitize_for_serialization(pod))


def wait_for(what: str, check: Callable[[], Any], timeout: float, every: float = 0.2) -> Any:
    """Poll `check` until it returns something true; that value, or None on timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    print(f"   ({what}: nothing after {timeout:.0f}s)")
    return None


def summary(pod: dict[str, Any] | None) -> dict[str, Any]:
    """What the operator reads of a pod: phase, conditions, the container's states."""
    if pod is None:
        return {"gone": True}
    status = pod.get("status") or {}
    out: dict[str, Any] = {"phase": status.get("phase")}
    for key in ("reason", "message"):
        if status.get(key):
            out[f"pod {key}"] = status[key]
    out["conditions"] = sorted(
        f"{c['type']}={c['status']}" + (f" ({c['reason']})" if c.get("reason") else "")
        for c in status.get("conditions") or []
    )
    for cs in status.get("containerStatuses") or []:
        for which in ("state", "lastState"):
            for kind, fields in (cs.get(which) or {}).items():
                kept = {
                    k: v
                    for k, v in fields.items()
                    if k not in ("containerID", "startedAt", "finishedAt")
                }
                out[f"{which}.{kind}"] = kept
        out["restartCount"] = cs.get("restartCount")
    if pod["metadata"].get("deletionTimestamp"):
        out["deleting"] = True
    return out


def events(t: Target, name: str) -> list[str]:
    items = t.core.list_namespaced_event(
        t.namespace, field_selector=f"involvedObject.name={name}"
    ).items
    return sorted({f"{e.reason}: {e.message}" for e in items if e.type == "Warning"})


def host_pids(marker: str) -> list[int]:
    """Processes of this machine running a probe's program (kind's containers included)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            comm = (proc / "comm").read_text().strip()
        except OSError:
            continue
        if marker.encode() in argv and comm.startswith("python"):
            pids.append(int(proc.name))
    return pids


def signal_from_host(t: Target, name: str, sig: int) -> bool:
    pids = wait_for(f"{name} process", lambda: host_pids(t.marker(name)), 60)
    for pid in pids or []:
        os.kill(pid, sig)
    return bool(pids)


def running(t: Target, name: str) -> bool:
    pod = read(t, name)
    return bool(pod and (pod.get("status") or {}).get("phase") == "Running")


def terminal(t: Target, name: str) -> dict[str, Any] | None:
    pod = read(t, name)
    return pod if pod and (pod.get("status") or {}).get("phase") in TERMINAL else None
