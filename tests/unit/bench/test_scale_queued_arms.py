"""The scale benchmark's arms under Kueue: the same workloads naming one LocalQueue, and a
ClusterQueue whose quota is every pool's chips."""

from __future__ import annotations

import pytest
from bench.bench_scale import peers, workloads


@pytest.mark.parametrize(
    ("arm", "kind", "prefix"),
    [("tpujob-kueue", "TPUTrainingJob", "tk"), ("jobset-kueue", "JobSet", "jk")],
)
def test_a_queued_arm_runs_its_base_workload_naming_the_queue(
    arm: str, kind: str, prefix: str
) -> None:
    shape = workloads.Shape(pools=4, run_for="10s")
    body = workloads.manifest(arm, shape, 7, "bench")
    plain = workloads.manifest(workloads.base(arm), shape, 7, "bench")
    assert body["kind"] == kind == plain["kind"]
    assert body["metadata"]["name"] == f"{prefix}-0007"
    assert body["metadata"]["labels"] == {workloads.QUEUE_LABEL: workloads.QUEUE}
    assert body["spec"] == plain["spec"]
    assert workloads.workload_of_pod(f"{prefix}-0007-1-0-2") == f"{prefix}-0007"


def test_the_queue_covers_the_tpu_chips_of_every_pool() -> None:
    flavor, cluster_queue, local = peers.kueue_queues(
        "bench", "q", "tpu-v5-lite-podslice", "4x4", quota=25 * 16
    )
    assert flavor["spec"]["nodeLabels"]["cloud.google.com/gke-tpu-topology"] == "4x4"
    (group,) = cluster_queue["spec"]["resourceGroups"]
    assert group["flavors"][0]["resources"] == [{"name": "google.com/tpu", "nominalQuota": 400}]
    assert (local["metadata"]["namespace"], local["spec"]["clusterQueue"]) == ("bench", "bench")
