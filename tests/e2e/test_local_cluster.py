"""The local cluster behaves like a Kubernetes cluster with GKE TPU node pools.

Each test creates real objects through the real API server and waits for what the scheduler,
the controller-manager and the node agent do with them.
"""

from __future__ import annotations

import sys
import textwrap
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import LocalCluster, wait_for

pytestmark = pytest.mark.cluster
PY = sys.executable
TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def pod_manifest(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "local", "command": command, **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [container],
            "terminationGracePeriodSeconds": 2,
            **spec,
        },
    }


def phase_of(core: client.CoreV1Api, ns: str, name: str) -> str:
    return str(core.read_namespaced_pod(name, ns).status.phase)


def terminated_state(core: client.CoreV1Api, ns: str, name: str) -> Any:
    pod = core.read_namespaced_pod(name, ns)
    statuses = pod.status.container_statuses or []
    return statuses[0].state.terminated if statuses else None


def test_failed_container_reports_exit_code_and_termination_message(
    core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_pod(
        namespace, pod_manifest("bad", ["sh", "-c", "echo bad >/dev/termination-log; exit 3"])
    )
    wait_for(lambda: phase_of(core, namespace, "bad") == "Failed", timeout=60, what="Failed")
    state = terminated_state(core, namespace, "bad")
    # The file's bytes as written, newline included, as the kubelet reports them.
    assert (state.exit_code, state.reason, state.message) == (3, "Error", "bad\n")


def test_fallback_to_logs_on_error_puts_the_log_tail_in_the_message(
    core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_pod(
        namespace,
        pod_manifest(
            "tail",
            ["sh", "-c", "echo first; echo 'Gloo all-reduce failed' >&2; exit 1"],
            container={"terminationMessagePolicy": "FallbackToLogsOnError"},
        ),
    )
    wait_for(lambda: phase_of(core, namespace, "tail") == "Failed", timeout=60, what="Failed")
    assert "Gloo all-reduce failed" in terminated_state(core, namespace, "tail").message


def test_missing_command_fails_with_start_error(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(namespace, pod_manifest("nocmd", ["no-such-binary-xyz"]))
    wait_for(lambda: phase_of(core, namespace, "nocmd") == "Failed", timeout=60, what="Failed")
    state = terminated_state(core, namespace, "nocmd")
    assert state.reason == "StartError"
    assert state.exit_code == 128
    assert "no-such-binary-xyz" in state.message


def test_tpu_pods_land_only_on_tpu_nodes_with_room(core: client.CoreV1Api, namespace: str) -> None:
    tpu_nodes = [
        n
        for n in core.list_node().items
        if int((n.status.allocatable or {}).get("google.com/tpu", "0")) >= 4
    ]
    count = len(tpu_nodes) + 1
    for i in range(count):
        core.create_namespaced_pod(
            namespace,
            pod_manifest(
                f"tpu-{i}",
                ["sleep", "300"],
                tolerations=[TPU_TOLERATION],
                container={"resources": {"limits": {"google.com/tpu": "4"}}},
            ),
        )

    def placed() -> list[Any] | None:
        pods = core.list_namespaced_pod(namespace).items
        bound = [p for p in pods if p.spec.node_name]
        return pods if len(bound) == count - 1 else None

    pods = wait_for(placed, timeout=60, what=f"{count - 1} pods bound")
    nodes = sorted(p.spec.node_name for p in pods if p.spec.node_name)
    assert nodes == sorted(n.metadata.name for n in tpu_nodes)  # one per TPU node, none twice

    def unschedulable() -> str:
        pending = next(p for p in core.list_namespaced_pod(namespace).items if not p.spec.node_name)
        cond = next((c for c in pending.status.conditions or [] if c.type == "PodScheduled"), None)
        return str(cond.message) if cond is not None and cond.message else ""

    assert "google.com/tpu" in wait_for(unschedulable, timeout=30, what="scheduler message")


SERVER = textwrap.dedent("""
    import socket
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 8476)); s.listen()
    while True:
        c, _ = s.accept(); c.sendall(socket.gethostname().encode()); c.close()
""")
CLIENT = textwrap.dedent("""
    import socket, sys, time
    for _ in range(100):
        try:
            c = socket.create_connection((sys.argv[1], 8476), timeout=2)
            print("got", c.recv(100).decode()); break
        except OSError as err:
            print("retry", err); time.sleep(0.3)
    else:
        sys.exit(1)
""")


def test_pods_reach_each_other_by_dns_name_on_their_own_addresses(
    core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "workers"},
            "spec": {"clusterIP": "None", "selector": {"app": "w"}, "ports": [{"port": 8476}]},
        },
    )
    for name in ("w0", "w1"):  # both listen on the same port: each pod has its own namespace
        core.create_namespaced_pod(
            namespace,
            {
                **pod_manifest(name, [PY, "-c", SERVER], hostname=name, subdomain="workers"),
                "metadata": {"name": name, "labels": {"app": "w"}},
            },
        )
    fqdn = f"w0.workers.{namespace}.svc.cluster.local"
    core.create_namespaced_pod(namespace, pod_manifest("client", [PY, "-c", CLIENT, fqdn]))
    wait_for(
        lambda: phase_of(core, namespace, "client") == "Succeeded",
        timeout=60,
        what="client Succeeded",
    )
    log = core.read_namespaced_pod_log("client", namespace)
    assert "got w0" in log
    ips = {core.read_namespaced_pod(n, namespace).status.pod_ip for n in ("w0", "w1", "client")}
    assert len(ips) == 3
    assert not any(ip.startswith("127.") for ip in ips)


def test_killed_container_reports_the_signal(
    cluster: LocalCluster, core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, pod_manifest("victim", ["sleep", "300"]))
    wait_for(lambda: phase_of(core, namespace, "victim") == "Running", timeout=60, what="Running")
    cluster.tpujob("local", "fault", "kill", "victim", "-n", namespace)
    wait_for(lambda: phase_of(core, namespace, "victim") == "Failed", timeout=30, what="Failed")
    assert terminated_state(core, namespace, "victim").exit_code == 137


def test_restart_policy_always_restarts_and_counts(core: client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_pod(
        namespace,
        {
            **pod_manifest("flaky", ["sh", "-c", "exit 2"]),
            "spec": {
                "restartPolicy": "Always",
                "containers": [
                    {"name": "main", "image": "local", "command": ["sh", "-c", "exit 2"]}
                ],
            },
        },
    )

    def restarted() -> bool:
        statuses = core.read_namespaced_pod("flaky", namespace).status.container_statuses
        return bool(statuses) and statuses[0].restart_count >= 2

    wait_for(restarted, timeout=60, what="two restarts")
    last = core.read_namespaced_pod("flaky", namespace).status.container_statuses[0].last_state
    assert last.terminated.exit_code == 2


def test_deleted_pod_gets_sigterm_then_goes(core: client.CoreV1Api, namespace: str) -> None:
    script = "trap 'echo term >/dev/termination-log; exit 0' TERM; while true; do sleep 0.1; done"
    core.create_namespaced_pod(namespace, pod_manifest("graceful", ["sh", "-c", script]))
    wait_for(lambda: phase_of(core, namespace, "graceful") == "Running", timeout=60, what="Running")
    core.delete_namespaced_pod("graceful", namespace)

    def gone() -> bool:
        return not any(
            p.metadata.name == "graceful" for p in core.list_namespaced_pod(namespace).items
        )

    wait_for(gone, timeout=30, what="pod removed")


def node_ready(core: client.CoreV1Api, name: str) -> str:
    node = core.read_node(name)
    return next(c.status for c in node.status.conditions if c.type == "Ready")


def test_node_down_makes_node_not_ready_and_evicts_its_pods(
    cluster: LocalCluster, core: client.CoreV1Api, namespace: str
) -> None:
    node = "tpu-pool-2-w1"
    core.create_namespaced_pod(
        namespace,
        pod_manifest("doomed", ["sleep", "300"], nodeName=node, tolerations=[TPU_TOLERATION]),
    )
    wait_for(lambda: phase_of(core, namespace, "doomed") == "Running", timeout=60, what="Running")
    cluster.tpujob("local", "fault", "node-down", node)
    try:
        wait_for(lambda: node_ready(core, node) == "Unknown", timeout=60, what="Ready=Unknown")
        # The node-lifecycle controller taints the node a moment after marking it Unknown.
        wait_for(
            lambda: (
                "node.kubernetes.io/unreachable"
                in {t.key for t in core.read_node(node).spec.taints or []}
            ),
            timeout=30,
            what="unreachable taint",
        )

        def evicted() -> bool:
            pod = core.read_namespaced_pod("doomed", namespace)
            conds = {c.type: c for c in pod.status.conditions or []}
            return pod.metadata.deletion_timestamp is not None and "DisruptionTarget" in conds

        wait_for(evicted, timeout=60, what="pod evicted with DisruptionTarget")
    finally:
        cluster.tpujob("local", "fault", "node-up", node)
    wait_for(lambda: node_ready(core, node) == "True", timeout=60, what="Ready again")


IN_CLUSTER = textwrap.dedent("""
    import time
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    config.load_incluster_config()
    api = client.CoreV1Api()
    ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
    print("pods:", len(api.list_namespaced_pod(ns).items), flush=True)
    try:
        api.list_namespaced_secret(ns)
        print("secrets: allowed", flush=True)
    except ApiException as err:
        print("secrets:", err.status, flush=True)
    time.sleep(3600)
""")


def test_deployment_pod_uses_its_service_account_with_rbac_enforced(
    cluster: LocalCluster, core: client.CoreV1Api, namespace: str
) -> None:
    api = cluster.api_client()
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "lister"}})
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "list-pods"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "list-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "list-pods",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "lister", "namespace": namespace}],
        },
    )
    client.AppsV1Api(api).create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "lister"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "lister"}},
                "template": {
                    "metadata": {"labels": {"app": "lister"}},
                    "spec": {
                        "serviceAccountName": "lister",
                        "containers": [
                            {"name": "main", "image": "local", "command": [PY, "-c", IN_CLUSTER]}
                        ],
                    },
                },
            },
        },
    )

    def log_lines() -> str:
        pods = core.list_namespaced_pod(namespace, label_selector="app=lister").items
        if not pods or pods[0].status.phase != "Running":
            return ""
        text = str(core.read_namespaced_pod_log(pods[0].metadata.name, namespace))
        return text if "secrets:" in text else ""

    text = wait_for(log_lines, timeout=90, what="in-cluster client output")
    assert "pods: 1" in text
    assert "secrets: 403" in text


def test_a_finished_pods_address_goes_to_one_new_pod_only(
    core: client.CoreV1Api, namespace: str
) -> None:
    # A finished pod gives its address back when its containers end; deleting it later from
    # the API must not give the address back a second time, while a newer pod holds it.
    core.create_namespaced_pod(namespace, pod_manifest("done", ["true"]))
    wait_for(lambda: phase_of(core, namespace, "done") == "Succeeded", timeout=60, what="Succeeded")
    freed = core.read_namespaced_pod("done", namespace).status.pod_ip

    def running_ip(name: str) -> str | None:
        pod = core.read_namespaced_pod(name, namespace)
        return pod.status.pod_ip if pod.status.phase == "Running" else None

    holder = None
    for i in range(8):  # pods created elsewhere meanwhile may take it first
        core.create_namespaced_pod(namespace, pod_manifest(f"holder-{i}", ["sleep", "300"]))
        ip = wait_for(lambda n=f"holder-{i}": running_ip(n), timeout=60, what="Running")
        if ip == freed:
            holder = f"holder-{i}"
            break
    assert holder is not None, f"no new pod was given the freed address {freed}"
    core.delete_namespaced_pod("done", namespace)
    wait_for(
        lambda: (
            not [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name == "done"]
        ),
        timeout=60,
        what="done deleted",
    )
    core.create_namespaced_pod(namespace, pod_manifest("after", ["sleep", "300"]))
    after = wait_for(lambda: running_ip("after"), timeout=60, what="Running")
    assert after != freed, f"pods {holder} and after share the address {freed}"
