"""The chart against a real apiserver: what `helm template` renders is accepted by server-side
dry-run, and the ClusterRole, once applied, lets the operator's ServiceAccount do what the
operator does and refuses it the rest (Secrets above all).

The chart's CRDs are applied with the command its README gives for upgrades, so that command is
exercised too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from tests.binaries import REPO_ROOT

pytestmark = pytest.mark.cluster

CHART = REPO_ROOT / "charts" / "tpujob-operator"


def run(
    cluster: Any, tool: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(cluster.bin_dir / tool), "--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, check=False, timeout=120
    )


def kubectl(cluster: Any, *args: str, stdin: str | None = None) -> str:
    result = run(cluster, "kubectl", *args, stdin=stdin)
    assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stderr}"
    return result.stdout


def helm_template(cluster: Any, release: str, namespace: str, *sets: str, only: str = "") -> str:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    if only:
        args += ["--show-only", only]
    result = run(cluster, "helm", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def chart_crds(cluster: Any, crds_installed: Any) -> None:
    """The chart's CRDs applied the way its README says to upgrade them."""
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    kubectl(
        cluster,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/clusterkopfpeerings.kopf.dev",
        "crd/kopfpeerings.kopf.dev",
        "crd/tputrainingjobs.tpujob.dev",
    )


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param((), id="defaults"),
        pytest.param(("replicas=2",), id="two-replicas"),
        pytest.param(("watchNamespaces={NAMESPACE}",), id="watch-namespaces"),
        pytest.param(
            ("grafanaDashboard.enabled=true", "image.repository=localhost/op", "image.tag=dev"),
            id="dashboard-and-local-image",
        ),
    ],
)
def test_rendered_chart_is_accepted_by_server_side_dry_run(
    cluster: Any, chart_crds: None, namespace: str, sets: tuple[str, ...]
) -> None:
    sets = tuple(s.replace("NAMESPACE", namespace) for s in sets)
    rendered = helm_template(cluster, "tpujob", namespace, *sets)
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    output = kubectl(cluster, "apply", "--dry-run=server", "-f", "-", stdin=rendered)
    accepted = [line for line in output.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objects), output


@pytest.fixture
def operator_account(cluster: Any, chart_crds: None, namespace: str) -> Iterator[str]:
    """The chart's ServiceAccount, ClusterRole and binding applied for real; yields the user."""
    # ClusterRoles are cluster-wide; the namespace's random suffix keeps tests apart.
    release = f"rbac-{namespace[-5:]}"
    manifests = "".join(
        helm_template(cluster, release, namespace, only=f"templates/{name}")
        for name in ("serviceaccount.yaml", "rbac.yaml")
    )
    kubectl(cluster, "apply", "-f", "-", stdin=manifests)
    account = next(
        doc["metadata"]["name"]
        for doc in yaml.safe_load_all(manifests)
        if doc and doc["kind"] == "ServiceAccount"
    )
    try:
        yield f"system:serviceaccount:{namespace}:{account}"
    finally:
        run(cluster, "kubectl", "delete", "--ignore-not-found", "-f", "-", stdin=manifests)


# (verb, resource, subresource)
Action = tuple[str, str, str]

# What the operator does, each of which must be allowed.
OPERATOR_ACTIONS: list[Action] = [
    ("watch", "tputrainingjobs.tpujob.dev", ""),
    ("patch", "tputrainingjobs.tpujob.dev", "status"),
    ("delete", "tputrainingjobs.tpujob.dev", ""),
    ("create", "pods", ""),
    ("delete", "pods", ""),
    ("get", "pods", "log"),
    ("create", "services", ""),
    ("create", "serviceaccounts", ""),
    ("create", "roles.rbac.authorization.k8s.io", ""),
    ("create", "rolebindings.rbac.authorization.k8s.io", ""),
    ("update", "leases.coordination.k8s.io", ""),
    ("create", "events", ""),
    ("create", "events.events.k8s.io", ""),
    ("patch", "nodes", ""),
    ("patch", "clusterkopfpeerings.kopf.dev", ""),
    ("patch", "kopfpeerings.kopf.dev", ""),
    ("watch", "namespaces", ""),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", ""),
]

# What it never does, each of which must be refused.
OUT_OF_BOUNDS: list[Action] = [
    ("get", "secrets", ""),
    ("list", "secrets", ""),
    ("watch", "secrets", ""),
    ("create", "pods", "exec"),
    ("create", "tputrainingjobs.tpujob.dev", ""),
    ("update", "pods", ""),
    ("delete", "nodes", ""),
    ("create", "customresourcedefinitions.apiextensions.k8s.io", ""),
    ("create", "clusterkopfpeerings.kopf.dev", ""),
    ("create", "deployments.apps", ""),
    ("create", "clusterroles.rbac.authorization.k8s.io", ""),
    ("bind", "roles.rbac.authorization.k8s.io", ""),
    ("escalate", "roles.rbac.authorization.k8s.io", ""),
    ("impersonate", "serviceaccounts", ""),
    ("create", "serviceaccounts", "token"),
]


def can_i(cluster: Any, user: str, namespace: str, action: Action) -> bool:
    verb, resource, sub = action
    args = ["auth", "can-i", verb, resource, "--as", user, "--namespace", namespace]
    if sub:
        args.append(f"--subresource={sub}")
    result = run(cluster, "kubectl", *args)
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


def test_operator_account_may_do_everything_the_operator_does(
    cluster: Any, operator_account: str, namespace: str
) -> None:
    refused = [
        action
        for action in OPERATOR_ACTIONS
        if not can_i(cluster, operator_account, namespace, action)
    ]
    assert not refused


def test_operator_account_is_refused_secrets_and_everything_else_unlisted(
    cluster: Any, operator_account: str, namespace: str
) -> None:
    allowed = [
        action for action in OUT_OF_BOUNDS if can_i(cluster, operator_account, namespace, action)
    ]
    assert not allowed


@pytest.mark.parametrize(
    ("grant", "allowed"),
    [
        # The per-job Role: the trainer may renew only its own heartbeat Lease.
        (("leases.coordination.k8s.io", "get,update,patch"), True),
        # Granting what the operator does not hold is an escalation the apiserver refuses.
        (("secrets", "get"), False),
    ],
    ids=["heartbeat-lease", "secrets-escalation"],
)
def test_operator_account_can_grant_a_heartbeat_role_and_nothing_beyond_its_own_rights(
    cluster: Any, operator_account: str, namespace: str, grant: tuple[str, str], allowed: bool
) -> None:
    resource, verbs = grant
    result = run(
        cluster,
        "kubectl",
        "create",
        "role",
        "heartbeat",
        f"--verb={verbs}",
        f"--resource={resource}",
        "--resource-name=some-job-heartbeat",
        "--namespace",
        namespace,
        "--as",
        operator_account,
        "--dry-run=server",
    )
    assert (result.returncode == 0) == allowed, result.stderr
    if not allowed:
        assert "forbidden" in result.stderr.lower()
