"""Contract tests for the Helm chart: it lints, renders what each value asks for, grants the
operator exactly the rights it uses, rejects values of the wrong type, and ships the CRDs the
rest of the repository generates.

They need only the helm binary (no cluster); tests/e2e/test_chart_render.py sends the same
renders to a real apiserver.
"""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.binaries import REPO_ROOT, binary

from tpujob.api.spec import TPUTrainingJobSpec

CHART = REPO_ROOT / "charts" / "tpujob-operator"
TOP_LEVEL_CRDS = REPO_ROOT / "crds"

Manifest = dict[str, Any]

# Every right the operator holds, as (API group, resource) -> verbs, split by where it holds
# it. Each is an API call the operator (or kopf for it) makes; the rendered roles must match
# exactly, so adding a right to the chart means adding it here too, in review.
CLUSTER_RIGHTS: dict[tuple[str, str], set[str]] = {
    ("", "nodes"): {"get", "list", "watch", "patch"},
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
}
ALL_NAMESPACES_CLUSTER_RIGHTS = {
    **CLUSTER_RIGHTS,
    ("kopf.dev", "clusterkopfpeerings"): {"list", "watch", "patch"},
    ("rbac.authorization.k8s.io", "clusterroles"): {"bind"},
}
WATCHED_NAMESPACES_CLUSTER_RIGHTS = {**CLUSTER_RIGHTS, ("", "namespaces"): {"list", "watch"}}
JOB_NAMESPACE_RIGHTS: dict[tuple[str, str], set[str]] = {
    ("tpujob.dev", "tputrainingjobs"): {"list", "watch", "patch", "delete"},
    ("tpujob.dev", "tputrainingjobs/status"): {"patch", "update"},
    ("", "pods"): {"list", "watch", "create", "delete", "patch"},
    ("", "pods/log"): {"get"},
    ("", "services"): {"create"},
    ("", "serviceaccounts"): {"create"},
    ("rbac.authorization.k8s.io", "roles"): {"create"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create"},
    ("coordination.k8s.io", "leases"): {"get", "list", "watch", "create", "update", "patch"},
    ("", "events"): {"create"},
}
WATCHED_NAMESPACE_RIGHTS = {
    **JOB_NAMESPACE_RIGHTS,
    ("kopf.dev", "kopfpeerings"): {"list", "watch", "patch"},
}
# Watching every namespace, Lease writes are not granted cluster-wide: the operator binds the
# -leases ClusterRole to itself in each namespace it runs a job in (LEASE_WRITER_RIGHTS there).
EVERY_JOB_NAMESPACE_RIGHTS = {
    **JOB_NAMESPACE_RIGHTS,
    ("coordination.k8s.io", "leases"): {"get", "list", "watch"},
}
LEASE_WRITER_RIGHTS: dict[tuple[str, str], set[str]] = {
    ("coordination.k8s.io", "leases"): {"get", "create", "update", "patch"}
}
LEASE_WRITER_ROLE = "tpujob-tpujob-operator-leases"
OWN_NAMESPACE_RIGHTS: dict[tuple[str, str], set[str]] = {
    ("", "configmaps"): {"get", "create", "patch"}
}
# With kueue.enabled: the Workloads of queued jobs where jobs run, and the flavors and priority
# classes they are admitted with, cluster-wide.
KUEUE_JOB_NAMESPACE_RIGHTS: dict[tuple[str, str], set[str]] = {
    ("kueue.x-k8s.io", "workloads"): {"list", "watch", "create", "patch"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
}
KUEUE_CLUSTER_RIGHTS: dict[tuple[str, str], set[str]] = {
    ("kueue.x-k8s.io", "resourceflavors"): {"list", "watch"},
    ("kueue.x-k8s.io", "workloadpriorityclasses"): {"get"},
    ("scheduling.k8s.io", "priorityclasses"): {"get"},
}
USER_ROLES = {"tpujob-edit", "tpujob-view"}

# The metric names the operator exports (tpujob.controller.metrics); the dashboard may query
# only these.
EXPORTED_METRICS = {
    "tpujob_jobs",
    "tpujob_failures_total",
    "tpujob_recovery_duration_seconds",
    "tpujob_goodput_ratio",
    "tpujob_failed_node_budget_remaining",
    "tpujob_restarts_total",
}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(binary("helm")), *args], capture_output=True, text=True, check=False, timeout=120
    )
    if check and result.returncode != 0:
        pytest.fail(f"helm {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def render(*sets: str, namespace: str = "tpujob-system", hooks: bool = False) -> list[Manifest]:
    """`helm template` with `--set` arguments, parsed into manifests; without `hooks`, only
    what an installed release holds (a hook's objects exist only while it runs)."""
    args = ["template", "tpujob", str(CHART), "--namespace", namespace]
    for item in sets:
        args += ["--set", item]
    docs = [doc for doc in yaml.safe_load_all(helm(*args).stdout) if doc]
    return [
        doc
        for doc in docs
        if hooks or "helm.sh/hook" not in (doc["metadata"].get("annotations") or {})
    ]


def only(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def kinds(manifests: list[Manifest]) -> list[str]:
    return sorted(m["kind"] for m in manifests)


def rights(role: Manifest) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def operator_roles(manifests: list[Manifest]) -> list[Manifest]:
    """The Roles and ClusterRoles bound to the operator (not the users' aggregated ones)."""
    return [
        m
        for m in manifests
        if m["kind"] in ("Role", "ClusterRole") and m["metadata"]["name"] not in USER_ROLES
    ]


def named(
    manifests: list[Manifest], kind: str, name: str, namespace: str | None = None
) -> Manifest:
    found = [
        m
        for m in manifests
        if m["kind"] == kind
        and m["metadata"]["name"] == name
        and m["metadata"].get("namespace") == namespace
    ]
    assert len(found) == 1, f"expected one {kind} {namespace}/{name}, rendered {len(found)}"
    return found[0]


def operator_container(manifests: list[Manifest]) -> Manifest:
    containers = only(manifests, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    container: Manifest = containers[0]
    return container


def walk_strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from walk_strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk_strings(item)


def test_chart_passes_strict_lint() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize(
    ("sets", "replicas", "namespace_args", "peering_kind", "peering_namespaces"),
    [
        pytest.param((), 1, ["--all-namespaces"], "ClusterKopfPeering", [None], id="defaults"),
        pytest.param(
            ("replicas=2",),
            2,
            ["--all-namespaces"],
            "ClusterKopfPeering",
            [None],
            id="two-replicas",
        ),
        pytest.param(
            ("watchNamespaces={team-a,team-b}",),
            1,
            ["--namespace=team-a", "--namespace=team-b"],
            "KopfPeering",
            ["team-a", "team-b"],
            id="watch-namespaces",
        ),
    ],
)
def test_render_follows_replicas_and_watched_namespaces(
    sets: tuple[str, ...],
    replicas: int,
    namespace_args: list[str],
    peering_kind: str,
    peering_namespaces: list[str | None],
) -> None:
    manifests = render(*sets)
    watched = [n for n in peering_namespaces if n is not None]
    # Cluster rights and the users' two roles; job-namespace rights cluster-wide or per
    # namespace; the operator's own-namespace Role; the hostPath policy, and the system-Lease
    # policy when every namespace is watched, with the Lease-writer ClusterRole the operator
    # binds to itself per job namespace.
    roles = (
        ["ClusterRole"] * 3
        + ["ClusterRoleBinding"]
        + ["Role", "RoleBinding"]
        + (
            ["Role", "RoleBinding"] * len(watched)
            if watched
            else ["ClusterRole", "ClusterRoleBinding", "ClusterRole"]
        )
    )
    # host paths and node marks always; system namespaces when every namespace is watched
    policies = ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * (
        2 if watched else 3
    )
    assert kinds(manifests) == sorted(
        ["Deployment", "Service", "ServiceAccount", *roles, *policies]
        + [peering_kind] * len(peering_namespaces)
    )
    assert only(manifests, "Deployment")["spec"]["replicas"] == replicas
    args = operator_container(manifests)["args"]
    assert [a for a in args if a.startswith(("--namespace", "--all-namespaces"))] == namespace_args
    assert "--peering=tpujob-operator" in args
    peerings = [m for m in manifests if m["kind"] == peering_kind]
    assert [p["metadata"]["name"] for p in peerings] == ["tpujob-operator"] * len(peerings)
    assert [p["metadata"].get("namespace") for p in peerings] == peering_namespaces


def test_operator_command_line_carries_ports_log_level_and_extra_args() -> None:
    container = operator_container(
        render("logLevel=DEBUG", "operator.extraArgs={--flag-a,--flag-b=1}")
    )
    assert container["command"] == ["tpujob", "operator"]
    assert container["args"] == [
        "--all-namespaces",
        "--lease-role=tpujob-tpujob-operator-leases",
        "--service-account=tpujob-tpujob-operator",
        "--peering=tpujob-operator",
        "--metrics-port=9090",
        "--metrics-address=$(POD_IP)",
        "--liveness-port=8080",
        "--liveness-address=$(POD_IP)",
        "--log-level=DEBUG",
        "--host-path-prefixes=",
        "--flag-a",
        "--flag-b=1",
    ]


def test_the_operator_is_given_the_host_path_prefixes_its_admission_policy_allows() -> None:
    # The operator enforces them itself too: a cluster without the policy is not left open.
    args = operator_container(render("hostPathPrefixes={/var/tmp/tpujob,/data/}"))["args"]
    assert "--host-path-prefixes=/var/tmp/tpujob,/data/" in args


@pytest.mark.parametrize(
    "sets", [(), ("watchNamespaces={team-a}",)], ids=["all-namespaces", "watch-namespaces"]
)
def test_roles_have_no_wildcard_and_nothing_on_secrets(sets: tuple[str, ...]) -> None:
    roles = [m for m in render(*sets) if m["kind"] in ("Role", "ClusterRole")]
    strings = list(walk_strings([r["rules"] for r in roles]))
    assert all(r["rules"] for r in roles), "a role has no rules"
    assert not [s for s in strings if "*" in s]
    assert not [s for s in strings if "secret" in s.lower()]
    # resourceNames only where a verb names one object: binding the -leases ClusterRole.
    assert all(
        set(rule) == {"apiGroups", "resources", "verbs"}
        or (
            set(rule) == {"apiGroups", "resources", "verbs", "resourceNames"}
            and rule["verbs"] == ["bind"]
        )
        for role in roles
        for rule in role["rules"]
    ), "rules use only apiGroups/resources/verbs (no nonResourceURLs)"


def test_every_namespace_gets_the_job_rights_when_every_namespace_is_watched() -> None:
    manifests = render(namespace="ops")
    assert rights(named(manifests, "ClusterRole", "tpujob-tpujob-operator")) == (
        ALL_NAMESPACES_CLUSTER_RIGHTS
    )
    assert rights(named(manifests, "ClusterRole", "tpujob-tpujob-operator-jobs")) == (
        EVERY_JOB_NAMESPACE_RIGHTS
    )
    assert rights(named(manifests, "ClusterRole", LEASE_WRITER_ROLE)) == LEASE_WRITER_RIGHTS
    assert rights(named(manifests, "Role", "tpujob-tpujob-operator-own", "ops")) == (
        OWN_NAMESPACE_RIGHTS
    )
    assert len(operator_roles(manifests)) == 4
    args = operator_container(manifests)["args"]
    assert f"--lease-role={LEASE_WRITER_ROLE}" in args
    bind = [
        r
        for r in named(manifests, "ClusterRole", "tpujob-tpujob-operator")["rules"]
        if r["verbs"] == ["bind"]
    ]
    assert [r.get("resourceNames") for r in bind] == [[LEASE_WRITER_ROLE]]


@pytest.mark.parametrize(
    "sets", [(), ("watchNamespaces={team-a}",)], ids=["all-namespaces", "watch-namespaces"]
)
def test_kueue_adds_workload_rights_where_jobs_run_and_flavor_reads_and_the_flag(
    sets: tuple[str, ...],
) -> None:
    manifests = render(*sets, "kueue.enabled=true", namespace="ops")
    watched = bool(sets)
    cluster = named(manifests, "ClusterRole", "tpujob-tpujob-operator")
    base = WATCHED_NAMESPACES_CLUSTER_RIGHTS if watched else ALL_NAMESPACES_CLUSTER_RIGHTS
    assert rights(cluster) == {**base, **KUEUE_CLUSTER_RIGHTS}
    jobs = (
        named(manifests, "Role", "tpujob-tpujob-operator-jobs", "team-a")
        if watched
        else named(manifests, "ClusterRole", "tpujob-tpujob-operator-jobs")
    )
    job_rights = WATCHED_NAMESPACE_RIGHTS if watched else EVERY_JOB_NAMESPACE_RIGHTS
    assert rights(jobs) == {**job_rights, **KUEUE_JOB_NAMESPACE_RIGHTS}
    assert "--kueue" in operator_container(manifests)["args"]
    assert "--kueue" not in operator_container(render(*sets, namespace="ops"))["args"]


def test_watched_namespaces_get_roles_and_nothing_namespaced_is_granted_cluster_wide() -> None:
    manifests = render("watchNamespaces={team-a,team-b}", namespace="ops")
    assert rights(named(manifests, "ClusterRole", "tpujob-tpujob-operator")) == (
        WATCHED_NAMESPACES_CLUSTER_RIGHTS
    )
    for team in ("team-a", "team-b"):
        role = named(manifests, "Role", "tpujob-tpujob-operator-jobs", team)
        assert rights(role) == WATCHED_NAMESPACE_RIGHTS
        binding = named(manifests, "RoleBinding", "tpujob-tpujob-operator-jobs", team)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "tpujob-tpujob-operator-jobs",
        }
    assert rights(named(manifests, "Role", "tpujob-tpujob-operator-own", "ops")) == (
        OWN_NAMESPACE_RIGHTS
    )
    assert len(operator_roles(manifests)) == 4
    cluster_bindings = [m for m in manifests if m["kind"] == "ClusterRoleBinding"]
    assert [b["roleRef"]["name"] for b in cluster_bindings] == ["tpujob-tpujob-operator"]


@pytest.mark.parametrize(
    "sets", [(), ("watchNamespaces={team-a}",)], ids=["all-namespaces", "watch-namespaces"]
)
@pytest.mark.parametrize("template", ["rbac.yaml", "user-roles.yaml"])
def test_every_role_rule_says_why(template: str, sets: tuple[str, ...]) -> None:
    args = ["template", "tpujob", str(CHART), "--show-only", f"templates/{template}"]
    for item in sets:
        args += ["--set", item]
    lines = helm(*args).stdout.splitlines()
    rule_lines = [i for i, line in enumerate(lines) if line.strip().startswith("- apiGroups:")]
    assert rule_lines
    uncommented = [
        lines[i + 1].strip() for i in rule_lines if not lines[i - 1].strip().startswith("#")
    ]
    assert not uncommented, f"rules without a comment: {uncommented}"


@pytest.mark.parametrize(
    "sets", [(), ("watchNamespaces={team-a}",)], ids=["all-namespaces", "watch-namespaces"]
)
def test_role_bindings_bind_the_operator_service_account(sets: tuple[str, ...]) -> None:
    manifests = render(*sets, namespace="ops")
    account = only(manifests, "ServiceAccount")
    pod_spec = only(manifests, "Deployment")["spec"]["template"]["spec"]
    bindings = [m for m in manifests if m["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    bound = {
        (b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
        for b in bindings
    }
    # The -leases ClusterRole is bound by the operator itself, one job namespace at a time.
    assert bound == {
        (r["kind"], r["metadata"]["name"], r["metadata"].get("namespace"))
        for r in operator_roles(manifests)
        if r["metadata"]["name"] != LEASE_WRITER_ROLE
    }
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "ops"}
        ]
    assert pod_spec["serviceAccountName"] == account["metadata"]["name"]


def test_user_roles_aggregate_into_the_built_in_edit_and_view_roles() -> None:
    manifests = render()
    edit = named(manifests, "ClusterRole", "tpujob-edit")
    view = named(manifests, "ClusterRole", "tpujob-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in view["metadata"]["labels"]
    assert rights(edit)[("tpujob.dev", "tputrainingjobs")] >= {"create", "update", "delete"}
    assert rights(view) == {
        ("tpujob.dev", "tputrainingjobs"): {"get", "list", "watch"},
        ("tpujob.dev", "tputrainingjobs/status"): {"get", "list", "watch"},
    }


def test_readme_says_creating_a_job_is_creating_pods() -> None:
    readme = " ".join((CHART / "README.md").read_text().split())
    assert "Creating a TPUTrainingJob is creating pods in its namespace" in readme


def host_path_policy(*sets: str) -> tuple[Manifest, Manifest]:
    manifests = render(*sets)
    name = "tpujob-tpujob-operator-host-paths"
    return (
        named(manifests, "ValidatingAdmissionPolicy", name),
        named(manifests, "ValidatingAdmissionPolicyBinding", name),
    )


@pytest.mark.parametrize(
    ("prefixes", "allowed"),
    [("", "[]"), ("{/var/tmp/tpujob/,/data}", '["/var/tmp/tpujob","/data"]'), ("{/}", '["/"]')],
    ids=["none-by-default", "trailing-slash-trimmed", "root"],
)
def test_host_path_policy_carries_the_allowed_prefixes(prefixes: str, allowed: str) -> None:
    policy, binding = host_path_policy(*([f"hostPathPrefixes={prefixes}"] if prefixes else []))
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["allowed"] == allowed
    assert "hostPathPrefixes" in policy["spec"]["validations"][0]["messageExpression"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]


def test_host_path_policy_binds_to_the_watched_namespaces_only() -> None:
    _, binding = host_path_policy("watchNamespaces={team-a,team-b}")
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert selector == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]


def test_system_namespace_policy_names_the_operator_and_the_system_namespaces() -> None:
    manifests = render(namespace="ops")
    name = "tpujob-tpujob-operator-system-namespaces"
    policy = named(manifests, "ValidatingAdmissionPolicy", name)
    binding = named(manifests, "ValidatingAdmissionPolicyBinding", name)
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert condition == (
        "request.userInfo.username == 'system:serviceaccount:ops:tpujob-tpujob-operator'"
    )
    values = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]
    assert values["values"] == ["kube-system", "kube-node-lease", "kube-public"]
    written = {
        r for rule in policy["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]
    }
    assert written == {"leases", "pods", "services", "serviceaccounts", "roles", "rolebindings"}


def test_node_marks_policy_binds_the_operator_everywhere_it_is_installed() -> None:
    for sets in ((), ("watchNamespaces={team-a}",)):
        manifests = render(*sets, namespace="ops")
        name = "tpujob-tpujob-operator-node-marks"
        policy = named(manifests, "ValidatingAdmissionPolicy", name)
        binding = named(manifests, "ValidatingAdmissionPolicyBinding", name)
        assert (
            "system:serviceaccount:ops:tpujob-tpujob-operator"
            in (policy["spec"]["matchConditions"][0]["expression"])
        )
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "matchResources" not in binding["spec"]


@pytest.mark.parametrize(
    ("set_arg", "complaint"),
    [
        ("replicas=two", "'/replicas'"),
        ("watchNamespaces=team-a", "'/watchNamespaces'"),
        ("serviceMonitor.enabled=yes", "'/serviceMonitor/enabled'"),
        ("metrics.port=metrics", "'/metrics/port'"),
        ("image.pullPolicy=Sometimes", "'/image/pullPolicy'"),
        ("logLevel=LOUD", "'/logLevel'"),
        ("watchNamespaces={Team_A}", "'/watchNamespaces/0'"),
        ("replica=2", "'replica' not allowed"),
    ],
)
@pytest.mark.parametrize("command", ["template", "lint"])
def test_values_schema_rejects_wrong_values_naming_the_field(
    command: str, set_arg: str, complaint: str
) -> None:
    args = [command, str(CHART), "--set", set_arg]
    if command == "template":
        args.insert(1, "tpujob")
    result = helm(*args, check=False)
    assert result.returncode != 0, f"{set_arg} was accepted"
    assert complaint in result.stdout + result.stderr


@pytest.mark.parametrize("tag", ["20261130", "1.10", "0.1.0-rc.1"])
def test_image_tag_is_used_as_written(tag: str) -> None:
    # helm --set turns an all-digit tag into an integer; it must not reach the image as 2.026e7.
    assert operator_container(render(f"image.tag={tag}"))["image"].endswith(f":{tag}")


def test_chart_crds_are_byte_identical_to_the_generated_ones() -> None:
    generated = sorted(p for p in TOP_LEVEL_CRDS.glob("*.yaml") if p.is_file())
    assert generated, f"{TOP_LEVEL_CRDS} holds no CRDs; run `make generate`"
    for source in generated:
        copy = CHART / "crds" / source.name
        assert copy.is_file(), f"the chart lacks {source.name}; run `make generate`"
        assert copy.read_bytes() == source.read_bytes(), f"{copy} differs from {source}"


def test_chart_ships_kopf_peering_crds() -> None:
    docs = list(yaml.safe_load_all((CHART / "crds" / "kopf.dev_peerings.yaml").read_text()))
    assert {(d["spec"]["names"]["kind"], d["spec"]["scope"]) for d in docs} == {
        ("ClusterKopfPeering", "Cluster"),
        ("KopfPeering", "Namespaced"),
    }


def test_default_image_is_the_operator_release() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    image = operator_container(render())["image"]
    assert image == f"ghcr.io/tpujob/tpujob-operator:{project['version']}"


def test_image_can_be_overridden_for_local_clusters() -> None:
    container = operator_container(
        render(
            "image.repository=localhost/tpujob-operator", "image.tag=dev", "image.pullPolicy=Never"
        )
    )
    assert container["image"] == "localhost/tpujob-operator:dev"
    assert container["imagePullPolicy"] == "Never"


def test_operator_runs_unprivileged_on_a_read_only_root() -> None:
    manifests = render()
    pod_spec = only(manifests, "Deployment")["spec"]["template"]["spec"]
    container = operator_container(manifests)
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["runAsNonRoot"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_spec["securityContext"]["runAsUser"] == 65532
    tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1
    volume = next(v for v in pod_spec["volumes"] if v["name"] == tmp[0]["name"])
    assert "emptyDir" in volume


@pytest.mark.parametrize(
    ("sets", "peers"),
    [
        ((), None),
        (
            ("networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",),
            [{"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}],
        ),
    ],
    ids=["nobody", "monitoring-namespace"],
)
def test_network_policy_admits_only_the_listed_peers_to_the_metrics_port(
    sets: tuple[str, ...], peers: list[Manifest] | None
) -> None:
    manifests = render("networkPolicy.enabled=true", *sets)
    policy = only(manifests, "NetworkPolicy")
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    if peers is None:
        assert policy["spec"]["ingress"] == []
    else:
        assert policy["spec"]["ingress"] == [
            {"from": peers, "ports": [{"port": "metrics", "protocol": "TCP"}]}
        ]


@pytest.mark.parametrize(
    ("sets", "metrics", "liveness"),
    [
        ((), "$(POD_IP)", "$(POD_IP)"),
        (
            ("metrics.bindAddress=0.0.0.0", "operator.livenessBindAddress=127.0.0.1"),
            "0.0.0.0",
            "127.0.0.1",
        ),
    ],
    ids=["pod-ip", "from-values"],
)
def test_metrics_and_liveness_listen_where_the_values_say(
    sets: tuple[str, ...], metrics: str, liveness: str
) -> None:
    container = operator_container(render(*sets))
    assert f"--metrics-address={metrics}" in container["args"]
    assert f"--liveness-address={liveness}" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_liveness_and_metrics_ports_are_wired_to_probe_and_service() -> None:
    manifests = render()
    container = operator_container(manifests)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 9090, "liveness": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    service = only(manifests, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["metadata"]["annotations"]["prometheus.io/port"] == "9090"
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    selector = service["spec"]["selector"]
    pod_labels = only(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


@pytest.mark.parametrize(
    ("sets", "present", "absent"),
    [
        ((), [], ["ServiceMonitor", "ConfigMap"]),
        (("serviceMonitor.enabled=true",), ["ServiceMonitor"], ["ConfigMap"]),
        (("grafanaDashboard.enabled=true",), ["ConfigMap"], ["ServiceMonitor"]),
        (("metrics.service.enabled=false",), [], ["Service"]),
        (
            ("rbac.create=false", "rbac.userRoles=false"),
            [],
            ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"],
        ),
        (
            ("admissionPolicies.enabled=false",),
            [],
            ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"],
        ),
        ((), [], ["NetworkPolicy"]),
        (("networkPolicy.enabled=true",), ["NetworkPolicy"], []),
    ],
)
def test_optional_objects_follow_their_values(
    sets: tuple[str, ...], present: list[str], absent: list[str]
) -> None:
    rendered = kinds(render(*sets))
    assert all(kind in rendered for kind in present)
    assert not [kind for kind in absent if kind in rendered]


def test_service_monitor_keeps_the_job_labels_of_the_metrics() -> None:
    monitor = only(render("serviceMonitor.enabled=true"), "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


def test_dashboard_config_map_carries_the_dashboard_for_grafana() -> None:
    config_map = only(render("grafanaDashboard.enabled=true"), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "tpujob.json").read_text())
    assert json.loads(config_map["data"]["tpujob.json"]) == shipped


def test_dashboard_charts_every_exported_metric_and_nothing_else() -> None:
    dashboard = json.loads((CHART / "dashboards" / "tpujob.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    used = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for query in queries
        for name in re.findall(r"\btpujob_[a-z_]+", query)
    }
    assert used == EXPORTED_METRICS


def test_crd_upgrade_command_is_documented_in_notes_and_readme() -> None:
    command = "kubectl apply --server-side --force-conflicts -f charts/tpujob-operator/crds/"
    assert command in (CHART / "templates" / "NOTES.txt").read_text()
    assert command in (CHART / "README.md").read_text()


def test_replicas_name_themselves_in_the_peering_object_by_pod_name() -> None:
    env = {e["name"]: e for e in operator_container(render())["env"]}
    assert env["POD_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_operator_image_runs_as_the_user_the_chart_expects() -> None:
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER (\d+)(?::(\d+))?$", dockerfile, re.MULTILINE)
    pod_context = only(render(), "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert users == [(str(pod_context["runAsUser"]), str(pod_context["runAsGroup"]))]


def test_docker_context_keeps_everything_the_operator_image_copies() -> None:
    copied = [
        source
        for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
        for source in line.split()[1:-1]
    ]
    ignored = [
        line.strip().rstrip("/")
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert copied, "the Dockerfile copies nothing from the context"
    assert not [s for s in copied if any(Path(s).match(pattern) for pattern in ignored)]


def test_kind_node_pools_each_hold_one_slice_of_the_kind_job() -> None:
    config = yaml.safe_load((REPO_ROOT / "kind-config.yaml").read_text())
    job = TPUTrainingJobSpec.model_validate(
        yaml.safe_load((REPO_ROOT / "hack" / "kind-job.yaml").read_text())["spec"]
    )
    pools: dict[str, list[dict[str, str]]] = {}
    for node in config["nodes"]:
        if node["role"] == "worker":
            pools.setdefault(node["labels"]["cloud.google.com/gke-nodepool"], []).append(
                node["labels"]
            )
    # Two pools, so a slice moved off a failed node has somewhere to go.
    assert len(pools) >= 2
    for workers in pools.values():
        assert {w["cloud.google.com/gke-tpu-accelerator"] for w in workers} == {job.tpu.accelerator}
        assert {w["cloud.google.com/gke-tpu-topology"] for w in workers} == {job.tpu.topology}
        assert len(workers) == job.tpu.hosts_per_slice
    script = (REPO_ROOT / "hack" / "e2e-kind.sh").read_text()
    assert f"chips_per_host={job.tpu.chips_per_host}\n" in script


def test_kind_multislice_job_takes_one_node_pool_per_slice_with_pod_names_the_script_kills() -> (
    None
):
    config = yaml.safe_load((REPO_ROOT / "kind-config.yaml").read_text())
    manifest = yaml.safe_load((REPO_ROOT / "hack" / "kind-multislice-job.yaml").read_text())
    job = TPUTrainingJobSpec.model_validate(manifest["spec"])
    single = TPUTrainingJobSpec.model_validate(
        yaml.safe_load((REPO_ROOT / "hack" / "kind-job.yaml").read_text())["spec"]
    )
    pools = {
        n["labels"]["cloud.google.com/gke-nodepool"]
        for n in config["nodes"]
        if n["role"] == "worker"
    }
    # Every pool is one slice of the one-slice job's shape; the multislice job fills them all.
    assert (job.tpu.accelerator, job.tpu.topology) == (single.tpu.accelerator, single.tpu.topology)
    assert job.tpu.slices == len(pools) > 1
    script = (REPO_ROOT / "hack" / "e2e-kind.sh").read_text()
    assert f"multislice={manifest['metadata']['name']}\n" in script
    # The pod the script kills is of the last slice, so slice 0 is the one kept in place.
    assert f'kill_trainer "$multislice-1-{job.tpu.slices - 1}-0"' in script


HOOK = "tpujob-tpujob-operator-release-jobs"


def _hook(*sets: str) -> list[Manifest]:
    return [
        m
        for m in render(*sets, namespace="ops", hooks=True)
        if (m["metadata"].get("annotations") or {}).get("helm.sh/hook") == "pre-delete"
    ]


@pytest.mark.parametrize(
    ("sets", "scope"),
    [
        pytest.param((), ["--all-namespaces"], id="all-namespaces"),
        pytest.param(
            ("watchNamespaces={a,b}",), ["--namespace=a", "--namespace=b"], id="watch-namespaces"
        ),
    ],
)
def test_uninstall_releases_the_jobs_of_the_watched_namespaces_as_the_operator(
    sets: tuple[str, ...], scope: list[str]
) -> None:
    hook = _hook(*sets)
    job = named(hook, "Job", HOOK, "ops")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "tpujob-tpujob-operator"
    (container,) = pod["containers"]
    assert container["command"] == ["tpujob", "release-jobs"]
    assert container["args"][:2] == [
        "--deployment=tpujob-tpujob-operator",
        "--deployment-namespace=ops",
    ]
    assert [a for a in container["args"] if a.startswith("--namespace") or "all" in a] == scope
    # Its pod is not one of the operator's, or it would wait for itself to stop.
    deployment = named(
        render(*sets, namespace="ops"), "Deployment", "tpujob-tpujob-operator", "ops"
    )
    selector = deployment["spec"]["selector"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert not set(selector["matchLabels"].items()) <= set(labels.items())
    # The RBAC comes first (a lower weight), and everything goes once it succeeded.
    weights = {m["kind"]: int(m["metadata"]["annotations"]["helm.sh/hook-weight"]) for m in hook}
    assert weights["Role"] < weights["Job"] and weights["RoleBinding"] < weights["Job"]


def test_the_uninstall_hook_may_only_scale_the_operator_down_and_see_its_pods() -> None:
    role = named(_hook(), "Role", HOOK, "ops")
    assert rights(role) == {
        ("apps", "deployments"): {"get"},
        ("apps", "deployments/scale"): {"patch"},
        ("", "pods"): {"list"},
    }
    assert all(
        rule["resourceNames"] == ["tpujob-tpujob-operator"]
        for rule in role["rules"]
        if rule["apiGroups"] == ["apps"]
    )
    binding = named(_hook(), "RoleBinding", HOOK, "ops")
    assert binding["roleRef"]["name"] == HOOK
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tpujob-tpujob-operator", "namespace": "ops"}
    ]


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        pytest.param((), ["Job", "Role", "RoleBinding"], id="default"),
        pytest.param(("rbac.create=false",), ["Job"], id="no-rbac"),
        pytest.param(("uninstall.releaseJobs=false",), [], id="off"),
    ],
)
def test_the_uninstall_hook_follows_its_values(sets: tuple[str, ...], expected: list[str]) -> None:
    assert kinds(_hook(*sets)) == expected
