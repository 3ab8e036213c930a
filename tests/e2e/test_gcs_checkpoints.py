"""gs:// checkpoints for real: the reference trainer writes orbax checkpoints to a local server
speaking the Cloud Storage JSON API (fake-gcs-server, built by `make binaries`), a worker fails
past step 30 (a collective timeout), and the next attempt resumes from what is in the bucket.

The trainer reaches the server as it reaches Cloud Storage, through gcsfs (etils' fsspec
backend) and TensorStore's GCS driver; only their endpoints and credentials are pointed at the
server, by the environment each honours. The server listens on the pod network's gateway, where
pods reach the host.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.e2e.conftest import LocalCluster, wait_for
from tests.e2e.operator_fixture import OperatorProcess, free_port
from tests.e2e.test_operator_recovery import Run, resumed_from_checkpoint, training_job

from tpujob.local.controlplane import ClusterState

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "tpujob-e2e"


@pytest.fixture
def storage_server(cluster: LocalCluster, tmp_path: Path) -> Iterator[str]:
    """A Cloud Storage server on the pod network's gateway holding one empty bucket; its URL."""
    binary = (
        subprocess.run(
            [str(ROOT / "tools" / "build-fake-gcs.sh")], capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    state = ClusterState.load(cluster.state_dir)
    assert state is not None
    host = state.network.gateway
    port = free_port(host)
    (tmp_path / "seed" / BUCKET).mkdir(parents=True)
    log = (tmp_path / "fake-gcs.log").open("w")
    server = subprocess.Popen(
        [
            binary,
            "-scheme=http",
            f"-host={host}",
            f"-port={port}",
            "-backend=filesystem",
            f"-filesystem-root={tmp_path / 'objects'}",
            f"-data={tmp_path / 'seed'}",
            f"-external-url=http://{host}:{port}",
            "-log-level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://{host}:{port}"
    try:
        wait_for(lambda: _buckets(url) == [BUCKET], timeout=30, what="the storage server")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def _buckets(url: str) -> list[str] | None:
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as reply:
            return [b["name"] for b in json.load(reply).get("items", [])]
    except OSError:
        return None


def committed_steps(url: str, prefix: str) -> set[int]:
    """The step folders under `prefix` in the bucket that orbax committed."""
    with urllib.request.urlopen(f"{url}/storage/v1/b/{BUCKET}/o?prefix={prefix}/", timeout=5) as r:
        names = [o["name"] for o in json.load(r).get("items", [])]
    parts = [n[len(prefix) + 1 :].split("/") for n in names]
    return {int(p[0]) for p in parts if p[0].isdigit() and "_CHECKPOINT_METADATA" in p}


def test_checkpoints_round_trip_through_cloud_storage(
    cluster: LocalCluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    storage_server: str,
) -> None:
    body = training_job("gcs", tmp_path, steps=60, faults=("exit-code=31@35:worker=0:attempt=1",))
    body["spec"]["checkpoint"] = {"uri": f"gs://{BUCKET}/runs/gcs", "intervalSteps": 10, "keep": 3}
    body["spec"]["trainer"]["env"] = [
        # gcsfs: the endpoint, no credentials, and no gRPC bucket-type probe (the server
        # speaks only the JSON API).
        {"name": "STORAGE_EMULATOR_HOST", "value": storage_server},
        {"name": "FSSPEC_GCS_TOKEN", "value": "anon"},
        {"name": "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "value": "false"},
        # TensorStore: the endpoint and a token it sends instead of asking the metadata server.
        {"name": "TENSORSTORE_GCS_HTTP_URL", "value": storage_server},
        {"name": "GOOGLE_AUTH_TOKEN_FOR_TESTING", "value": "local"},
        # The reference JAX image has no TensorFlow; here it is installed, and etils would
        # hand gs:// to it instead of gcsfs.
        {"name": "EPATH_USE_TF", "value": "false"},
    ]
    run = Run(cluster, namespace, operator, body)
    status = run.wait_phase("Succeeded")
    assert status["restarts"]["total"] == 1, status.get("lastFailure")
    first = status["attemptHistory"][0]
    assert first["failed"] and first["checkpointStep"] >= 10, first
    # Attempt 2 started from what attempt 1 had committed to the bucket, not from step 0.
    resumed_from_checkpoint(run, first["checkpointStep"])
    assert max(committed_steps(storage_server, "runs/gcs")) == 60
