"""The chart's RBAC judged by the apiserver: SubjectAccessReviews as the operator's
ServiceAccount, with the chart's roles applied for real.

What the operator calls must be allowed and nothing else: no verb it never calls, no Lease write
in `kube-system` or `kube-node-lease`, and with `watchNamespaces` no pod created outside them.
Watching every namespace RBAC cannot leave the system namespaces out, so there the chart's
ValidatingAdmissionPolicy must refuse the Lease write instead, which a server-side dry-run shows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from tests.contract.test_chart import (
    ALL_NAMESPACES_CLUSTER_RIGHTS,
    EVERY_JOB_NAMESPACE_RIGHTS,
    LEASE_WRITER_RIGHTS,
    OWN_NAMESPACE_RIGHTS,
    WATCHED_NAMESPACE_RIGHTS,
    WATCHED_NAMESPACES_CLUSTER_RIGHTS,
)
from tests.e2e.conftest import LocalCluster, helm_template, wait_for, wait_host_paths_admitted

from tpujob.api import labels

pytestmark = pytest.mark.cluster

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
SYSTEM_NAMESPACES = ("kube-system", "kube-node-lease")
CLUSTER_SCOPED = {"nodes", "namespaces", "customresourcedefinitions", "clusterkopfpeerings"}


@dataclass(frozen=True)
class Operator:
    """The chart's ServiceAccount, installed with its roles in `home`, serving `watched`."""

    user: str
    home: str
    watched: tuple[str, ...]
    authz: client.AuthorizationV1Api
    account: str = ""
    lease_role: str | None = None  # watching every namespace: bound by the operator itself

    def may(self, verb: str, group: str, resource: str, namespace: str | None = None) -> bool:
        resource, _, sub = resource.partition("/")
        review = {
            "spec": {
                "user": self.user,
                "groups": [
                    "system:serviceaccounts",
                    f"system:serviceaccounts:{self.home}",
                    "system:authenticated",
                ],
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": sub,
                    "namespace": namespace or "",
                },
            }
        }
        return bool(self.authz.create_subject_access_review(review).status.allowed)


@pytest.fixture
def other_namespace(core: client.CoreV1Api, namespace: str) -> Iterator[str]:
    name = f"{namespace[:50]}-other"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def install(
    cluster: LocalCluster, core: client.CoreV1Api, home: str, watched: tuple[str, ...]
) -> Iterator[Operator]:
    sets = [f"watchNamespaces={{{','.join(watched)}}}"] if watched else []
    rendered = helm_template(
        cluster,
        f"rbac-{home[-5:]}",
        home,
        *sets,
        only=(
            "templates/serviceaccount.yaml",
            "templates/rbac.yaml",
            "templates/admission-policies.yaml",
        ),
    )
    cluster.kubectl("apply", "-f", "-", input_text=rendered)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    account = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    lease_role = next(
        (
            d["metadata"]["name"]
            for d in docs
            if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-leases")
        ),
        None,
    )
    try:
        yield Operator(
            f"system:serviceaccount:{home}:{account}",
            home,
            watched,
            client.AuthorizationV1Api(core.api_client),
            account,
            lease_role,
        )
    finally:
        cluster.kubectl("delete", "--ignore-not-found", "-f", "-", input_text=rendered, check=False)
        wait_host_paths_admitted(cluster)


@pytest.fixture
def everywhere(
    cluster: LocalCluster, core: client.CoreV1Api, crds_installed: None, namespace: str
) -> Iterator[Operator]:
    """Installed in `namespace`, watching every namespace (the chart's default)."""
    yield from install(cluster, core, namespace, ())


@pytest.fixture
def scoped(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    crds_installed: None,
    namespace: str,
    other_namespace: str,
) -> Iterator[Operator]:
    """Installed in `namespace`, watching only `other_namespace`."""
    yield from install(cluster, core, namespace, (other_namespace,))


def bind_lease_writer(
    cluster: LocalCluster,
    operator: Operator,
    namespace: str,
    *,
    as_operator: bool = True,
    dry_run: bool = False,
) -> None:
    """Do as the operator does before a job's first Lease in `namespace`: bind the -leases
    ClusterRole to its own ServiceAccount there, as that ServiceAccount (so the bind right is
    what is tested, not the test's own), or, `as_operator` False, as a cluster admin would."""
    assert operator.lease_role is not None
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    if as_operator:
        rbac.api_client.default_headers["Impersonate-User"] = operator.user
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "tpujob-operator-leases"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": operator.lease_role,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": operator.account, "namespace": operator.home}
            ],
        },
        **({"dry_run": "All"} if dry_run else {}),
    )


def test_watching_everywhere_grants_lease_writes_only_where_the_operator_bound_them(
    cluster: LocalCluster, everywhere: Operator, other_namespace: str
) -> None:
    writes = ("create", "update", "patch")
    assert not any(
        everywhere.may(v, "coordination.k8s.io", "leases", other_namespace) for v in writes
    )
    bind_lease_writer(cluster, everywhere, other_namespace)
    wait_for(
        lambda: everywhere.may("patch", "coordination.k8s.io", "leases", other_namespace),
        timeout=30,
        what="the binding to take effect",
    )
    assert all(
        everywhere.may(verb, group, resource, other_namespace)
        for (group, resource), verbs in LEASE_WRITER_RIGHTS.items()
        for verb in verbs
    )
    granted = [
        (verb, ns)
        for ns in SYSTEM_NAMESPACES
        for verb in writes
        if everywhere.may(verb, "coordination.k8s.io", "leases", ns)
    ]
    assert not granted
    # The bind right names that one ClusterRole: binding any other is an escalation.
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    rbac.api_client.default_headers["Impersonate-User"] = everywhere.user
    with pytest.raises(ApiException) as refused:
        rbac.create_namespaced_role_binding(
            other_namespace,
            {
                "metadata": {"name": "escalate"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "admin",
                },
                "subjects": [
                    {
                        "kind": "ServiceAccount",
                        "name": everywhere.account,
                        "namespace": everywhere.home,
                    }
                ],
            },
            dry_run="All",
        )
    assert refused.value.status == 403


def test_watching_everywhere_allows_every_call_and_no_other_verb(
    everywhere: Operator, other_namespace: str
) -> None:
    wrong = []
    for rights, where in (
        (ALL_NAMESPACES_CLUSTER_RIGHTS, None),
        (EVERY_JOB_NAMESPACE_RIGHTS, other_namespace),
        (OWN_NAMESPACE_RIGHTS, everywhere.home),
    ):
        for (group, resource), verbs in rights.items():
            namespace = None if resource in CLUSTER_SCOPED else where
            for verb in VERBS:
                if everywhere.may(verb, group, resource, namespace) != (verb in verbs):
                    wrong.append((verb, group, resource, namespace))
    assert not wrong


def test_watching_namespaces_allows_every_call_there_and_no_other_verb(scoped: Operator) -> None:
    wrong = []
    for rights, where in (
        (WATCHED_NAMESPACES_CLUSTER_RIGHTS, None),
        (WATCHED_NAMESPACE_RIGHTS, scoped.watched[0]),
        (OWN_NAMESPACE_RIGHTS, scoped.home),
    ):
        for (group, resource), verbs in rights.items():
            namespace = None if resource in CLUSTER_SCOPED else where
            for verb in VERBS:
                if scoped.may(verb, group, resource, namespace) != (verb in verbs):
                    wrong.append((verb, group, resource, namespace))
    assert not wrong


# What the operator never does, whatever the install: each must be refused.
NEVER = [
    ("get", "", "secrets"),
    ("list", "", "secrets"),
    ("watch", "", "secrets"),
    ("create", "", "pods/exec"),
    ("create", "", "pods/eviction"),
    ("update", "", "pods"),
    ("create", "tpujob.dev", "tputrainingjobs"),
    ("update", "tpujob.dev", "tputrainingjobs"),
    ("delete", "", "services"),
    ("delete", "", "serviceaccounts"),
    ("create", "", "serviceaccounts/token"),
    ("delete", "rbac.authorization.k8s.io", "roles"),
    ("delete", "rbac.authorization.k8s.io", "rolebindings"),
    ("bind", "rbac.authorization.k8s.io", "roles"),
    ("escalate", "rbac.authorization.k8s.io", "roles"),
    ("delete", "coordination.k8s.io", "leases"),
    ("create", "apps", "deployments"),
    ("create", "events.k8s.io", "events"),
    ("impersonate", "", "serviceaccounts"),
    ("get", "", "configmaps"),
]
NEVER_CLUSTER = [
    ("delete", "", "nodes"),
    ("update", "", "nodes"),
    ("create", "apiextensions.k8s.io", "customresourcedefinitions"),
    ("create", "rbac.authorization.k8s.io", "clusterroles"),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
    ("create", "kopf.dev", "clusterkopfpeerings"),
]


@pytest.mark.parametrize("install_kind", ["everywhere", "scoped"])
def test_operator_is_refused_what_it_never_calls(
    install_kind: str, request: pytest.FixtureRequest, other_namespace: str
) -> None:
    operator: Operator = request.getfixturevalue(install_kind)
    job_namespace = other_namespace
    allowed = [
        (verb, group, resource)
        for verb, group, resource in NEVER
        if operator.may(verb, group, resource, job_namespace)
    ]
    allowed += [
        (verb, group, resource)
        for verb, group, resource in NEVER_CLUSTER
        if operator.may(verb, group, resource)
    ]
    assert not allowed


def test_watching_namespaces_grants_no_lease_write_in_system_namespaces(scoped: Operator) -> None:
    granted = [
        (verb, ns)
        for ns in SYSTEM_NAMESPACES
        for verb in ("create", "update", "patch")
        if scoped.may(verb, "coordination.k8s.io", "leases", ns)
    ]
    assert not granted
    assert scoped.may("update", "coordination.k8s.io", "leases", scoped.watched[0])


def test_watching_namespaces_creates_no_pod_outside_them(scoped: Operator) -> None:
    assert scoped.may("create", "", "pods", scoped.watched[0])
    outside = [
        ns for ns in (scoped.home, "kube-system", "default") if scoped.may("create", "", "pods", ns)
    ]
    assert not outside
    assert not scoped.may("create", "", "pods")


def _refused(call: Callable[[], object]) -> str:
    """The refusal's message, or "" when the call went through."""
    try:
        call()
    except ApiException as err:
        return str(err.body or err.reason)
    return ""


def lease_write_refusal(cluster: LocalCluster, operator: Operator, namespace: str) -> str:
    proc = cluster.kubectl(
        "create",
        "-f",
        "-",
        "--dry-run=server",
        "--as",
        operator.user,
        "--as-group",
        "system:serviceaccounts",
        "--namespace",
        namespace,
        check=False,
        input_text=yaml.safe_dump(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "tpujob-probe", "namespace": namespace},
                "spec": {"holderIdentity": "tpujob"},
            }
        ),
    )
    return proc.stderr if proc.returncode != 0 else ""


@pytest.mark.parametrize("system_namespace", SYSTEM_NAMESPACES)
def test_watching_everywhere_the_policy_refuses_lease_writes_in_system_namespaces(
    cluster: LocalCluster, everywhere: Operator, other_namespace: str, system_namespace: str
) -> None:
    # RBAC refuses first: the operator holds Lease writes only where it bound them.
    assert "forbidden" in lease_write_refusal(cluster, everywhere, system_namespace)

    # It may bind that role in any namespace, but the policy refuses it any RoleBinding in a
    # system namespace (a compromised operator cannot grant itself Leases there).
    def bind_refused() -> str:
        found = _refused(
            lambda: bind_lease_writer(cluster, everywhere, system_namespace, dry_run=True)
        )
        return found if "system namespaces" in found else ""

    refused = wait_for(
        bind_refused,
        timeout=30,
        what=f"the policy to refuse the operator a RoleBinding in {system_namespace}",
    )
    assert "may not write rolebindings in system namespaces" in refused
    # Bound there anyway (by an admin's mistake), the policy still refuses the Lease write.
    bind_lease_writer(cluster, everywhere, system_namespace, as_operator=False)
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    try:
        refusal = wait_for(
            lambda: (
                "system namespaces"
                in (found := lease_write_refusal(cluster, everywhere, system_namespace))
                and found
            ),
            timeout=30,
            what=f"the policy to refuse a Lease in {system_namespace}",
        )
        assert "may not write leases in system namespaces" in refusal
    finally:
        rbac.delete_namespaced_role_binding("tpujob-operator-leases", system_namespace)
    bind_lease_writer(cluster, everywhere, other_namespace)
    wait_for(
        lambda: lease_write_refusal(cluster, everywhere, other_namespace) == "",
        timeout=30,
        what=f"a Lease write allowed in {other_namespace}",
    )


@pytest.mark.parametrize(
    ("rule", "allowed"),
    [
        # The per-job Role: the trainer may renew only its own heartbeat Lease.
        (
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "resourceNames": ["some-job-heartbeat"],
                "verbs": ["get", "update", "patch"],
            },
            True,
        ),
        # Granting what the operator does not hold is an escalation the apiserver refuses.
        ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}, False),
    ],
    ids=["heartbeat-lease", "secrets-escalation"],
)
def test_operator_can_grant_a_heartbeat_role_and_nothing_beyond_its_own_rights(
    cluster: LocalCluster, scoped: Operator, rule: dict[str, object], allowed: bool
) -> None:
    rbac = client.RbacAuthorizationV1Api(cluster.api_client())
    rbac.api_client.default_headers["Impersonate-User"] = scoped.user
    role = {"metadata": {"name": "heartbeat"}, "rules": [rule]}
    try:
        rbac.create_namespaced_role(scoped.watched[0], role, dry_run="All")
        refused = None
    except ApiException as err:
        refused = err
    assert (refused is None) == allowed, refused
    if refused is not None:
        assert refused.status == 403


def node_patch_refusal(
    cluster: LocalCluster, operator: Operator, node: str, patch: dict[str, object]
) -> str:
    proc = cluster.kubectl(
        "patch",
        "node",
        node,
        "--type=merge",
        "-p",
        json.dumps(patch),
        "--dry-run=server",
        "--as",
        operator.user,
        "--as-group",
        "system:serviceaccounts",
        check=False,
    )
    return proc.stderr if proc.returncode != 0 else ""


@pytest.mark.parametrize(
    ("change", "refused_for"),
    [
        ("mark", None),
        ("label", "labels"),
        ("annotation", "own (tpujob.dev/) annotations"),
        ("taint", "own (tpujob.dev/) taints"),
    ],
)
def test_the_operator_may_change_only_its_own_marks_on_a_node(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    everywhere: Operator,
    change: str,
    refused_for: str | None,
) -> None:
    """RBAC grants `patch` on nodes whole; the chart's node-marks policy refuses everything but
    the operator's own taint and annotation (server-side dry-runs: nothing changes)."""
    node = core.list_node().items[0]
    taints = [
        {k: v for k, v in (("key", t.key), ("value", t.value), ("effect", t.effect)) if v}
        for t in node.spec.taints or []
    ]
    mark = {"key": labels.BAD_NODE_TAINT, "value": "job", "effect": "NoSchedule"}
    patches = {
        "mark": {
            "metadata": {"annotations": {labels.BAD_NODE_REASON: "drill"}},
            "spec": {"taints": [*taints, mark]},
        },
        "label": {"metadata": {"labels": {labels.NODEPOOL: "somewhere-else"}}},
        "annotation": {"metadata": {"annotations": {"example.com/owner": "tpujob"}}},
        "taint": {"spec": {"taints": [*taints, {"key": "example.com/x", "effect": "NoSchedule"}]}},
    }

    def refusal() -> str:
        return node_patch_refusal(cluster, everywhere, node.metadata.name, patches[change])

    if refused_for is None:
        wait_for(lambda: refusal() == "", timeout=30, what="the operator's own mark allowed")
    else:
        found = wait_for(
            lambda: refused_for in (text := refusal()) and text,
            timeout=30,
            what=f"the policy to refuse a change of {change}",
        )
        assert "Forbidden" in found or "denied" in found, found
