"""The measurements of one run of one arm on its own fresh cluster.

ladder    N workloads created at once on N pools: create -> all pods Running per workload.
drain     J workloads that run for a fixed time, created at once on fewer pools: queueing,
          makespan (first create -> last workload done) and throughput.
recovery  N workloads running on N + 10 % pools; 5 % of pods failed at once, then 2 % of nodes
          lost (repaired as GKE would: the Nodes deleted at +60 s, recreated at +90 s); fault ->
          the workload running again, per affected workload.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client

from scale import nodes, workloads
from scale.cluster import NAMESPACE, ArmCluster, Snapshot, cost
from scale.stats import dist
from scale.tracker import Tracker

MERGE = "application/merge-patch+json"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
REPAIR_DELETE_S, REPAIR_RECREATE_S = 60, 90


def create_all(cluster: ArmCluster, shape: workloads.Shape, count: int) -> dict[str, float]:
    """Create `count` workloads at once (8 client threads); returns name -> local create time."""
    custom, batch = client.CustomObjectsApi(cluster.api), client.BatchV1Api(cluster.api)
    created: dict[str, float] = {}

    def one(i: int) -> None:
        body = workloads.manifest(cluster.arm, shape, i, NAMESPACE)
        created[body["metadata"]["name"]] = time.monotonic()
        kind = workloads.base(cluster.arm)
        if kind == "tpujob":
            custom.create_namespaced_custom_object(
                "tpujob.dev", "v1alpha1", NAMESPACE, "tputrainingjobs", body
            )
        elif kind == "jobset":
            custom.create_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", body
            )
        else:
            batch.create_namespaced_job(NAMESPACE, body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))
    return created


def start_tracker(cluster: ArmCluster, shape: workloads.Shape) -> Tracker:
    tracker = Tracker(cluster.api, NAMESPACE, shape.pods)
    tracker.start()
    time.sleep(1)
    return tracker


def launch(
    cluster: ArmCluster, shape: workloads.Shape, count: int
) -> tuple[Tracker, dict[str, float], float, Snapshot]:
    """Watch, take the cost snapshot, create the workloads at once."""
    tracker = start_tracker(cluster, shape)
    before = cluster.snapshot()
    t0 = time.monotonic()
    return tracker, create_all(cluster, shape, count), t0, before


def wait(
    done: Any,
    timeout: float,
    series: list[tuple[float, int]],
    t0: float,
    tracker: Tracker,
    *,
    stages: list[tuple[float, int, int, int, int]] | None = None,
) -> bool:
    """Until `done()` or the timeout; samples the Running pods (and, given `stages`, the pods
    created, bound, Running and refused a node) every half second."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at = round(time.monotonic() - t0, 2)
        counts = tracker.stage_counts()
        series.append((at, counts[2]))
        if stages is not None:
            stages.append((at, *counts))
        if done():
            return True
        time.sleep(0.5)
    return False


def placement(tracker: Tracker) -> dict[str, int]:
    """Pools holding Running pods, and pools shared by more than one workload."""
    by_pool: dict[str, set[str]] = {}
    for p in tracker.snapshot_pods().values():
        if p.phase == "Running" and p.node.startswith(nodes.POOL_PREFIX):
            by_pool.setdefault(nodes.pool_of(p.node), set()).add(p.workload)
    return {
        "pools_used": len(by_pool),
        "pools_shared": sum(1 for w in by_pool.values() if len(w) > 1),
    }


def ladder(
    cluster: ArmCluster, shape: workloads.Shape, count: int, timeout: float
) -> dict[str, Any]:
    tracker, created, t0, before = launch(cluster, shape, count)
    series: list[tuple[float, int]] = []
    stages: list[tuple[float, int, int, int, int]] = []
    ok = wait(lambda: len(tracker.running_at) >= count, timeout, series, t0, tracker, stages=stages)
    after = cluster.snapshot()
    tracker.stop()
    latencies = [tracker.running_at[w] - t for w, t in created.items() if w in tracker.running_at]
    last = max(tracker.running_at.values(), default=None)
    pods = count * shape.pods
    makespan = round(last - t0, 2) if ok and last else None
    return {
        "workloads": count,
        "pods": pods,
        "all_running": ok,
        "timeout_s": timeout,
        "workloads_running": len(tracker.running_at),
        "pods_running_at_end": tracker.running_count(),
        "create_to_running_s": dist(latencies),
        "makespan_s": makespan,
        "pods_per_s": round(pods / makespan, 2) if makespan else None,
        **placement(tracker),
        "cost": cost(cluster.arm, before, after),
        "running_pods_over_time": series[:: max(1, len(series) // 200)],
        # [seconds, pods created, bound, Running, refused a node]: where a stall is
        "pod_stages_over_time": stages[:: max(1, len(stages) // 200)],
        "unschedulable_messages": dict(tracker.unschedulable_messages),
    }


def drain(
    cluster: ArmCluster, shape: workloads.Shape, count: int, timeout: float
) -> dict[str, Any]:
    tracker, created, t0, before = launch(cluster, shape, count)
    series: list[tuple[float, int]] = []
    ok = wait(lambda: len(tracker.done_at) >= count, timeout, series, t0, tracker)
    after = cluster.snapshot()
    tracker.stop()
    waits = [tracker.running_at[w] - t for w, t in created.items() if w in tracker.running_at]
    last = max(tracker.done_at.values(), default=None)
    makespan = round(last - t0, 2) if ok and last else None
    pods = count * shape.pods
    done_curve = sorted(round(t - t0, 2) for t in tracker.done_at.values())
    return {
        "workloads": count,
        "pools": shape.pools,
        "run_for": shape.run_for,
        "pods": pods,
        "all_done": ok,
        "timeout_s": timeout,
        "workloads_done": len(tracker.done_at),
        "create_to_running_s": dist(waits),
        "makespan_s": makespan,
        "pods_per_s": round(pods / makespan, 2) if makespan else None,
        "cost": cost(cluster.arm, before, after),
        "done_over_time": [[t, k + 1] for k, t in enumerate(done_curve)][
            :: max(1, len(done_curve) // 250)
        ],
    }


def recovery(
    cluster: ArmCluster,
    shape: workloads.Shape,
    count: int,
    *,
    timeout: float,
    seed: int,
    pod_fraction: float = 0.05,
    node_fraction: float = 0.02,
) -> dict[str, Any]:
    rng = random.Random(seed)
    tracker, created, t0, _ = launch(cluster, shape, count)
    series: list[tuple[float, int]] = []
    ok = wait(lambda: len(tracker.running_at) >= count, timeout, series, t0, tracker)
    out: dict[str, Any] = {
        "workloads": count,
        "pools": shape.pools,
        "seed": seed,
        "all_running_before_faults": ok,
        "workloads_running_before_faults": len(tracker.running_at),
        "create_to_running_s": dist(
            [tracker.running_at[w] - t for w, t in created.items() if w in tracker.running_at]
        ),
    }
    core = client.CoreV1Api(cluster.api)
    # Fault P: 5 % of the pods, at most one per workload, exit 137.
    running = sorted(tracker.running_at)
    n_pods = max(1, round(pod_fraction * count * shape.pods))
    victims = {}
    pods = tracker.snapshot_pods()
    for w in rng.sample(running, min(n_pods, len(running))):
        live = sorted(n for n, p in pods.items() if p.workload == w and p.phase == "Running")
        if live:
            victims[rng.choice(live)] = w
    before = cluster.snapshot()
    t_fault = time.monotonic()
    tracker.restart_clock(set(victims.values()), set(victims))
    patch = {
        "metadata": {
            "labels": {FAIL_LABEL: "true"},
            "annotations": {f"{FAIL_LABEL}/exit-code": "137"},
        }
    }
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: core.patch_namespaced_pod(n, NAMESPACE, patch), victims))
    out["pods_failed"] = phase_result(
        cluster,
        tracker,
        set(victims.values()),
        t_fault=t_fault,
        timeout=timeout,
        before=before,
        faults=len(victims),
    )
    # Fault N: 2 % of the nodes (of pools holding a running workload), lost at once.
    n_nodes = max(1, round(node_fraction * shape.pools * shape.pods))
    pods = tracker.snapshot_pods()
    busy = sorted(
        {
            p.node
            for p in pods.values()
            if p.phase == "Running" and not p.deleting and p.node.startswith(nodes.POOL_PREFIX)
        }
    )
    lost = rng.sample(busy, min(n_nodes, len(busy)))
    hit = {n: p.workload for n, p in pods.items() if p.node in lost}
    before = cluster.snapshot()
    t_fault = time.monotonic()
    tracker.restart_clock(set(hit.values()), set(hit))
    for name in lost:
        core.patch_node(name, {"metadata": {"labels": {nodes.MANAGED: "lost"}}})
    repair = threading.Thread(target=repair_nodes, args=(cluster, lost, t_fault), daemon=True)
    repair.start()
    out["nodes_lost"] = phase_result(
        cluster,
        tracker,
        set(hit.values()),
        t_fault=t_fault,
        timeout=timeout,
        before=before,
        faults=len(lost),
    )
    repair.join()
    tracker.stop()
    return out


def phase_result(
    cluster: ArmCluster,
    tracker: Tracker,
    affected: set[str],
    *,
    t_fault: float,
    timeout: float,
    before: Any,
    faults: int,
) -> dict[str, Any]:
    series: list[tuple[float, int]] = []
    ok = wait(lambda: affected <= set(tracker.running_at), timeout, series, t_fault, tracker)
    after = cluster.snapshot()
    back = [tracker.running_at[w] - t_fault for w in affected if w in tracker.running_at]
    return {
        "faults": faults,
        "workloads_affected": len(affected),
        "all_recovered": ok,
        "recovered": len(back),
        "not_recovered": len(affected) - len(back),
        "timeout_s": timeout,
        "fault_to_running_s": dist(back),
        "cost": cost(cluster.arm, before, after),
    }


def repair_nodes(cluster: ArmCluster, lost: list[str], t_fault: float) -> None:
    """GKE's node repair, the same for every arm: delete the lost VMs, recreate them, and let
    their kubelets finish the pods that were being deleted there."""
    core = client.CoreV1Api(cluster.api)
    time.sleep(max(0.0, t_fault + REPAIR_DELETE_S - time.monotonic()))
    for name in lost:
        with contextlib.suppress(client.exceptions.ApiException):
            core.delete_node(name)
    time.sleep(max(0.0, t_fault + REPAIR_RECREATE_S - time.monotonic()))
    _, chips = nodes.slice_shape(cluster.settings.topology)
    for name in lost:
        with contextlib.suppress(client.exceptions.ApiException):
            core.create_node(
                nodes.node(
                    name,
                    nodes.pool_of(name),
                    cluster.settings.accelerator,
                    cluster.settings.topology,
                    chips,
                )
            )
    # A repaired VM's kubelet finishes the pods still bound to it that were being deleted; kwok
    # does that only when such a pod changes, so touch them (before PodGC's ~40 s they are not
    # orphans yet, and would hold the node's chips for ever).
    time.sleep(5)
    pods = core.list_namespaced_pod(NAMESPACE, _preload_content=False)
    for pod in json.loads(pods.data)["items"]:
        meta = pod["metadata"]
        if pod["spec"].get("nodeName") in lost and meta.get("deletionTimestamp"):
            with contextlib.suppress(client.exceptions.ApiException):
                core.patch_namespaced_pod(
                    meta["name"],
                    NAMESPACE,
                    {"metadata": {"labels": {"bench.tpujob.dev/kubelet-resync": "true"}}},
                )
