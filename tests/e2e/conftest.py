"""Fixtures for tests against the local cluster: one cluster per test session, a namespace per test.

The cluster is the real thing `tpujob local up` starts (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager and the node agent); binaries are built once per machine and reused.
Its TPU pools are small two-host slices (tpu-v4-podslice 2x2x2) so multi-host behaviour is
real while the machine stays unloaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tpujob.api import GROUP, PLURAL, VERSION
from tpujob.local import controlplane
from tpujob.local.binaries import binary_dir


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `long` first (the order is otherwise kept): started last, one of them
    would keep one test worker busy for minutes after the others ran out of work."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "tpujob-operator"
TEST_POOLS = controlplane.PoolOptions(
    pools=3, accelerator="tpu-v4-podslice", topology="2x2x2", spare_nodes=1
)


@dataclass
class LocalCluster:
    state_dir: Path
    kubeconfig: Path
    bin_dir: Path
    server: str

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def tpujob(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the `tpujob` CLI as a user would, against this cluster."""
        argv = [sys.executable, "-m", "tpujob.cli", *args]
        if args and args[0] == "local":
            argv += ["--state-dir", str(self.state_dir)]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed: {proc.stdout}\n{proc.stderr}")
        return proc

    def kubectl(
        self, *args: str, input_text: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            input=input_text,
            check=False,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's cluster. Under `pytest -n`, each worker has a cluster of its own; they
    start one at a time, since a starting cluster picks its free ports and pod range by looking
    at what is in use, which two starting at once could both pick."""
    state_dir = tmp_path_factory.mktemp("cluster")
    with _one_at_a_time(tmp_path_factory.getbasetemp().parent / "cluster-up.lock"):
        state = controlplane.up(state_dir, TEST_POOLS, out=sys.stderr)
    try:
        yield LocalCluster(state_dir, state_dir / "kubeconfig", binary_dir(), state.server)
    finally:
        controlplane.down(state_dir)


@contextlib.contextmanager
def _one_at_a_time(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+") as handle:  # closing it releases the lock
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def core(cluster: LocalCluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api_client())


@pytest.fixture(scope="session")
def crds_installed(cluster: LocalCluster) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    wait_established(cluster, crd_names(ROOT / "crds"))


def crd_names(folder: Path) -> list[str]:
    """The names of the CustomResourceDefinitions in the YAML files of `folder`."""
    names = []
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                names.append(doc["metadata"]["name"])
    return names


def wait_established(cluster: LocalCluster, names: list[str], timeout: float = 60) -> None:
    """Poll until every named CRD has the condition Established=True.

    `kubectl wait --for=condition=...` fails at once, instead of waiting, when it reads an
    object whose `status.conditions` does not exist yet, which is the case right after a create.
    """
    api = client.ApiextensionsV1Api(cluster.api_client())

    def established(name: str) -> bool:
        try:
            crd = api.read_custom_resource_definition(name)
        except ApiException:
            return False
        return any(
            c.type == "Established" and c.status == "True"
            for c in (crd.status.conditions if crd.status else None) or []
        )

    for name in names:
        wait_for(lambda n=name: established(n), timeout=timeout, what=f"CRD {name} Established")


@pytest.fixture
def namespace(core: client.CoreV1Api, request: pytest.FixtureRequest) -> Iterator[str]:
    base = request.node.name.lower().replace("_", "-")
    name = "".join(ch for ch in base if ch.isalnum() or ch == "-")[:40].strip("-")
    name = create_namespace(core, f"{name}-{uuid.uuid4().hex[:5]}")
    yield name
    delete_namespace(core, name)


def delete_namespace(core: client.CoreV1Api, name: str, timeout: float = 90) -> None:
    """Delete a test namespace, its TPUTrainingJobs first (waiting for them, within reason).

    A namespace deletion alone can leave its jobs behind for good under an operator that
    watches namespaces by pattern (`--namespace test-*`): the operator framework stops
    watching a namespace once it is marked for deletion with no blocking condition, which can
    happen before the namespace controller marks the jobs, and a job nobody watches keeps its
    finalizer (and the pools it holds) while the namespace waits on it. Deleting the jobs while
    the namespace is still active keeps one test's jobs out of the next test's way.
    """
    custom = client.CustomObjectsApi(core.api_client)
    with contextlib.suppress(ApiException):
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, name, PLURAL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]:
                break
        except ApiException:
            break
        time.sleep(0.5)
    core.delete_namespace(name)


# The controller-manager's ServiceAccount controller makes a namespace's `default` account, and
# no pod is admitted before it exists. It is quick on a quiet cluster, but on a machine running
# two clusters' control planes and a test that just restarted an apiserver it has been seen to
# take over 30 s: the bound is generous since nothing here is what a test measures.
SERVICE_ACCOUNT_WAIT = 120


def create_namespace(core: client.CoreV1Api, name: str) -> str:
    """Create a namespace and wait until pods can be created in it (its default account)."""
    core.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: _has_default_sa(core, name),
        timeout=SERVICE_ACCOUNT_WAIT,
        what=f"the default ServiceAccount of namespace {name}",
    )
    return name


def _has_default_sa(core: client.CoreV1Api, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
    except ApiException:
        return False
    return True


def wait_for(check: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@pytest.fixture(scope="session")
def operator(
    cluster: LocalCluster, crds_installed: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    from tests.e2e.operator_fixture import OPERATOR_HOME, OperatorProcess

    core = client.CoreV1Api(cluster.api_client())
    with contextlib.suppress(client.ApiException):  # kept from an earlier module's operator
        core.create_namespace({"metadata": {"name": OPERATOR_HOME}})
    proc = OperatorProcess(cluster.kubeconfig, tmp_path_factory.mktemp("operator") / "log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def healthy_nodes(cluster: LocalCluster, core: client.CoreV1Api) -> Iterator[None]:
    """Undo every node fault and mark a test leaves behind, and wait until all are Ready.

    Faults are undone in this process, not through the CLI a test strikes with: two CLI runs
    per node after every test took 15-19 s."""
    yield
    from tpujob.api import labels
    from tpujob.local import faults

    for node in core.list_node().items:
        name = node.metadata.name
        faults.set_node_fault(
            cluster.state_dir,
            name,
            down=False,
            kubelet_stopped=False,
            not_ready=False,
            tpu_unhealthy=False,
        )
        taints = [
            t
            for t in node.spec.taints or []
            if t.key != labels.BAD_NODE_TAINT and t.key not in labels.MAINTENANCE_TAINTS
        ]
        node_labels = {
            k: None for k in labels.MAINTENANCE_LABELS if k in (node.metadata.labels or {})
        }
        kept = [
            {
                k: v
                for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect))
                if v is not None
            }
            for t in taints
        ]
        core.patch_node(
            name,
            {
                "metadata": {"labels": node_labels},
                "spec": {"unschedulable": None, "taints": kept or None},
            },
            _content_type="application/merge-patch+json",
        )

    def all_ready() -> bool:
        for node in core.list_node().items:
            ready = next(c.status for c in node.status.conditions if c.type == "Ready")
            keys = {t.key for t in node.spec.taints or []}
            if ready != "True" or keys & {
                "node.kubernetes.io/unreachable",
                "node.kubernetes.io/not-ready",
            }:
                return False
        return True

    wait_for(all_ready, timeout=90, what="every node Ready and untainted")


def wait_host_paths_admitted(cluster: LocalCluster, timeout: float = 90) -> None:
    """Poll until a job with a hostPath checkpoint is admitted in `default` again.

    A test that applies the chart's admission policies and deletes them leaves them in force
    for a while: the apiserver drops a deleted policy from its own cache asynchronously. The
    tests after it submit hostPath jobs, so the next test must not start before then.
    """
    from tpujob.api import GROUP, PLURAL, VERSION

    custom = client.CustomObjectsApi(cluster.api_client())
    probe = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TPUTrainingJob",
        "metadata": {"name": "admission-probe"},
        "spec": {
            "tpu": {"accelerator": "tpu-v4-podslice", "topology": "2x2x2"},
            "trainer": {"image": "local", "command": ["true"]},
            "checkpoint": {"volume": {"hostPath": "/var/tmp/probe"}},
            "recovery": {"maxFailedNodes": 1},
        },
    }

    def admitted() -> bool:
        try:
            custom.create_namespaced_custom_object(
                GROUP, VERSION, "default", PLURAL, probe, dry_run="All"
            )
        except ApiException:
            return False
        return True

    wait_for(admitted, timeout=timeout, what="hostPath jobs admitted again", interval=1)


def helm_template(
    cluster: LocalCluster, release: str, namespace: str, *sets: str, only: tuple[str, ...] = ()
) -> str:
    """`helm template` of the chart with `--set` values, limited to the `only` templates."""
    args = [
        str(cluster.bin_dir / "helm"),
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
    ]
    for item in sets:
        args += ["--set", item]
    for template in only:
        args += ["--show-only", template]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
