"""`tpujob doctor`: read the cluster, print the findings, exit 1 on a problem.

The shell around `tpujob.doctor.checks`: every read is its own try, so one refused list (RBAC)
becomes one finding and the other checks still run. A cluster that cannot be reached at all
(or a kubeconfig that names none) has nothing to check: that is one line and exit 1
(`tpujob.kubeconfig.ClusterError`), as for `get` and `describe`.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from rich.console import Console
from rich.markup import escape

from tpujob.api import GROUP, PLURAL, VERSION
from tpujob.api.labels import TPU_RESOURCE
from tpujob.doctor.checks import (
    CRD_NAME,
    OPERATOR_APP,
    Check,
    Finding,
    Level,
    Snapshot,
    examine,
    exit_status,
)
from tpujob.gcp.catalogue import Catalogue
from tpujob.kube.errors import KubeError, NotFoundError, UnavailableError, call
from tpujob.kubeconfig import Cluster, add_cluster_options, connect

STYLE = {Level.OK: "green", Level.INFO: "cyan", Level.WARNING: "yellow", Level.PROBLEM: "red"}


def register(subparsers: Any) -> None:
    doctor = subparsers.add_parser(
        "doctor", help="check that the cluster can run TPU training jobs; say what to fix"
    )
    add_cluster_options(doctor, namespaced=False)
    doctor.add_argument("--json", action="store_true", help="findings as a JSON list")
    doctor.add_argument(
        "--project",
        default=None,
        help="Google Cloud project whose zone catalogue to check shapes against",
    )
    doctor.add_argument(
        "--zones", default="", help="comma-separated zones of the cluster's TPU node pools"
    )
    doctor.set_defaults(handler=_doctor)


def _read(
    cluster: Cluster,
    unreadable: dict[Check, str],
    check: Check,
    read: Callable[[], Any],
    missing: Any = None,
) -> Any:
    try:
        return read()
    except NotFoundError:
        return missing
    except KubeError as err:
        if isinstance(err, UnavailableError) and err.unreachable:
            raise cluster.explain(err) from err
        unreadable[check] = f"HTTP {err.status} {err.reason}"
    except Exception as err:  # one object the client cannot parse spoils one check, not all
        unreadable[check] = f"{type(err).__name__}: {str(err)[:200]}"
    return missing


def snapshot(cluster: Cluster, catalogue: Catalogue | None) -> Snapshot:
    api = cluster.api
    core = client.CoreV1Api(api)
    ext = client.ApiextensionsV1Api(api)
    custom = client.CustomObjectsApi(api)
    raw = api.sanitize_for_serialization
    bad: dict[Check, str] = {}
    crd = _read(
        cluster, bad, Check.CRD, lambda: raw(call(ext.read_custom_resource_definition, CRD_NAME))
    )
    operator = _read(
        cluster,
        bad,
        Check.OPERATOR,
        lambda: raw(
            call(
                core.list_pod_for_all_namespaces,
                label_selector=f"app.kubernetes.io/name={OPERATOR_APP}",
            ).items
        ),
        [],
    )
    nodes = _read(cluster, bad, Check.NODE_POOLS, lambda: raw(call(core.list_node).items), [])
    pods = _read(
        cluster,
        bad,
        Check.NODE_POOLS,
        lambda: raw(
            call(
                core.list_pod_for_all_namespaces,
                field_selector="status.phase!=Succeeded,status.phase!=Failed",
            ).items
        ),
        [],
    )
    namespaces = _read(
        cluster, bad, Check.POD_SECURITY, lambda: raw(call(core.list_namespace).items), []
    )
    jobs = (
        _read(
            cluster,
            bad,
            Check.POD_SECURITY,
            lambda: call(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)["items"],
            [],
        )
        if crd
        else []
    )
    tpu_pods = [
        p
        for p in pods
        if any(
            TPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {})
            for c in (p.get("spec") or {}).get("containers") or []
        )
    ]
    return Snapshot(
        crd=crd,
        operator_pods=operator,
        nodes=nodes,
        tpu_pods=tpu_pods,
        namespaces=namespaces,
        jobs=jobs,
        catalogue=catalogue,
        unreadable=bad,
    )


def _catalogue(project: str | None, zones: str) -> Catalogue | None:
    if not project:
        return None
    from tpujob.gcp.client import CatalogueConfig, CatalogueSource, parse_zones

    return CatalogueSource(CatalogueConfig(project=project, zones=parse_zones(zones))).refresh()


def render(findings: tuple[Finding, ...], console: Console) -> None:
    current = None
    for f in findings:
        if f.check is not current:
            current = f.check
            console.print(f"[bold]{f.check}[/bold]")
        mark = f"[{STYLE[f.level]}]{f.level!s:<7}[/{STYLE[f.level]}]"
        console.print(f"  {mark} {escape(f.subject)}: {escape(f.message)}", highlight=False)
        if f.action and f.level is not Level.OK:
            console.print(f"          -> {escape(f.action)}", highlight=False)
    problems = sum(f.level is Level.PROBLEM for f in findings)
    warnings = sum(f.level is Level.WARNING for f in findings)
    console.print(f"{problems} problem(s), {warnings} warning(s)")


def _doctor(args: argparse.Namespace) -> int:
    cluster = connect(args.kubeconfig, args.context)
    findings = examine(snapshot(cluster, _catalogue(args.project, args.zones)))
    if args.json:
        print(json.dumps([f.as_json() for f in findings], indent=2))
    else:
        render(findings, Console())
    return exit_status(findings)
