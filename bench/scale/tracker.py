"""Pod timelines seen from outside, the same for every arm: a watch thread stamps local arrival
times of each workload's pods reaching Running and Succeeded, and counts the pods at each stage
(created, bound to a node, Running, and those the scheduler found no node for), so a stall shows
where it is: in the controller (no pods), the scheduler (pods, none bound; with the scheduler's
own words, a few kept) or the node (bound, not Running).

A workload is *running* when it has as many Running pods as its slice has hosts, counting only
pods not being deleted and not excluded (the pods a fault hit), so a restart is over only when
replacements run. It is *done* when that many of its pods have Succeeded.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from scale.workloads import workload_of_pod


@dataclass
class PodState:
    workload: str
    phase: str
    deleting: bool
    node: str
    unschedulable: bool = False


MESSAGES_KEPT = 20  # the scheduler's words vary with the cluster's counts: a few are enough


@dataclass
class Tracker:
    api: Any
    namespace: str
    pods_per_workload: int
    pods: dict[str, PodState] = field(default_factory=dict)
    running_at: dict[str, float] = field(default_factory=dict)  # workload -> all Running
    done_at: dict[str, float] = field(default_factory=dict)  # workload -> all Succeeded
    pod_running_at: dict[str, float] = field(default_factory=dict)
    succeeded: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    excluded: set[str] = field(default_factory=set)
    # The scheduler's messages on pods it could not place -> how many times each was seen.
    unschedulable_messages: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: bool = False

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self._stop = True

    def _run(self) -> None:
        core = client.CoreV1Api(self.api)
        while not self._stop:
            try:
                stream = watch.Watch().stream(
                    core.list_namespaced_pod,
                    self.namespace,
                    deserialize=False,
                    timeout_seconds=3600,
                )
                for event in stream:
                    if self._stop:
                        return
                    self._on(event["type"], event["object"])
            except Exception:  # an expired watch: the next one starts with a fresh list
                time.sleep(0.2)

    def _on(self, kind: str, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        name = meta.get("name", "")
        workload = workload_of_pod(name)
        if workload is None:
            return
        phase = status.get("phase", "")
        refused = next(
            (
                c
                for c in status.get("conditions") or ()
                if c.get("type") == "PodScheduled" and c.get("status") == "False"
            ),
            None,
        )
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = PodState(
                    workload,
                    phase,
                    bool(meta.get("deletionTimestamp")),
                    (pod.get("spec") or {}).get("nodeName") or "",
                    refused is not None,
                )
            if refused is not None:
                said = str(refused.get("message") or refused.get("reason") or "")
                if said in self.unschedulable_messages or (
                    len(self.unschedulable_messages) < MESSAGES_KEPT
                ):
                    self.unschedulable_messages[said] = self.unschedulable_messages.get(said, 0) + 1
            if phase == "Running":
                self.pod_running_at.setdefault(name, now)
            if phase == "Succeeded":
                self.succeeded[workload].add(name)
                if (
                    len(self.succeeded[workload]) >= self.pods_per_workload
                    and workload not in self.done_at
                ):
                    self.done_at[workload] = now
            self._check(workload, now)

    def _check(self, workload: str, now: float) -> None:
        if workload in self.running_at:
            return
        if len(self.live_running(workload)) >= self.pods_per_workload:
            self.running_at[workload] = now

    def live_running(self, workload: str) -> list[str]:
        return [
            n
            for n, p in self.pods.items()
            if p.workload == workload
            and p.phase == "Running"
            and not p.deleting
            and n not in self.excluded
        ]

    def restart_clock(self, workloads: set[str], excluded: set[str]) -> None:
        """A fault hit `excluded` pods: these workloads are running again only with others."""
        with self.lock:
            self.excluded |= excluded
            for w in workloads:
                self.running_at.pop(w, None)
            now = time.monotonic()
            for w in workloads:
                self._check(w, now)

    def snapshot_pods(self) -> dict[str, PodState]:
        with self.lock:
            return dict(self.pods)

    def running_count(self) -> int:
        return self.stage_counts()[2]

    def stage_counts(self) -> tuple[int, int, int, int]:
        """Pods not being deleted: (created, bound to a node, Running, refused a node by the
        scheduler and not bound since)."""
        with self.lock:
            live = [p for p in self.pods.values() if not p.deleting]
        return (
            len(live),
            sum(1 for p in live if p.node),
            sum(1 for p in live if p.phase == "Running"),
            sum(1 for p in live if p.unschedulable and not p.node),
        )
