"""Per-controller API identities, so each controller's requests are counted apart, by verb.

A controller run as a process gets its own client certificate (CN `bench:NAME`, group
`bench:controllers`, bound to cluster-admin). Every identity, and the built-in Job controller's
service account, gets one FlowSchema per verb (`bench-NAME-VERB`) sending its requests to the
`exempt` priority level (no queuing, the same for every arm). The apiserver then counts them in
`apiserver_flowcontrol_dispatched_requests_total{flow_schema="bench-NAME-VERB"}`, with no audit
log and no apiserver flag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpujob.local import pki

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
JOB_CONTROLLER = "job-controller"  # KCM's per-controller service account in kube-system


def objects(subjects: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The binding of the bench group and the FlowSchemas for `subjects` (name -> subject)."""
    out: list[dict[str, Any]] = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-controllers-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [
                {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Group",
                    "name": "bench:controllers",
                }
            ],
        }
    ]
    for name, subject in subjects.items():
        for verb in VERBS:
            out.append(
                {
                    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
                    "kind": "FlowSchema",
                    "metadata": {"name": f"bench-{name}-{verb}"},
                    "spec": {
                        "matchingPrecedence": 100,
                        "priorityLevelConfiguration": {"name": "exempt"},
                        "rules": [
                            {
                                "subjects": [subject],
                                "resourceRules": [
                                    {
                                        "verbs": [verb],
                                        "apiGroups": ["*"],
                                        "resources": ["*"],
                                        "namespaces": ["*"],
                                        "clusterScope": True,
                                    }
                                ],
                            }
                        ],
                    },
                }
            )
    return out


def user_subject(name: str) -> dict[str, Any]:
    return {"kind": "User", "user": {"name": f"bench:{name}"}}


def job_controller_subject() -> dict[str, Any]:
    return {
        "kind": "ServiceAccount",
        "serviceAccount": {"name": JOB_CONTROLLER, "namespace": "kube-system"},
    }


def kubeconfig(state_dir: Path, name: str, server: str) -> Path:
    """A kubeconfig for `bench:NAME`, signed by the local cluster's CA."""
    ca = pki.CertificateAuthority(state_dir / "pki")
    ident = pki.Identity(f"bench-{name}", f"bench:{name}", ("bench:controllers",))
    cert, key = ca.issue_client(ident)
    return pki.write_kubeconfig(
        state_dir / f"{name}.kubeconfig",
        server=server,
        ca_path=ca.cert_path,
        cert_path=cert,
        key_path=key,
        user=ident.user,
    )
