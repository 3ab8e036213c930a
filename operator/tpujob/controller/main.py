"""`tpujob operator`: run the operator (kopf) with its metrics and liveness endpoints.

Both endpoints are unauthenticated, so they listen on one address, loopback unless told
otherwise: the chart passes the pod's own IP, where Prometheus and the kubelet reach them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
from typing import Any

from tpujob.api import labels
from tpujob.controller import collector
from tpujob.controller.native_memory import TRIM_INTERVAL_SECONDS, limit_arenas, trim
from tpujob.observed.nodes import DEFAULT_HEALTH, NodeHealthSettings
from tpujob.plan.result import PlannerSettings

DEFAULT_BIND_ADDRESS = "127.0.0.1"


def liveness_url(address: str, port: int) -> str | None:
    """kopf's liveness endpoint for `address`:`port` (IPv6 in brackets); None when port is 0."""
    if not port:
        return None
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}/healthz"


def positive_seconds(text: str) -> float:
    """An argparse type: seconds above zero (a divisor somewhere downstream)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be above 0 seconds, not {text}")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("operator", help="run the TPUTrainingJob operator")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--all-namespaces",
        action="store_true",
        default=True,
        help="watch jobs in every namespace (default)",
    )
    scope.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable; a glob such as 'team-*' "
        "also works, but then the operator lists pods and Leases in every "
        "namespace, keeping those of matching ones, and needs the right to; "
        "and delete a namespace's jobs before the namespace: once a namespace "
        "is being deleted it may no longer be watched, and its jobs keep "
        "their finalizer)",
    )
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--metrics-port", type=int, default=9090, help="0 disables metrics")
    p.add_argument(
        "--metrics-address", default=DEFAULT_BIND_ADDRESS, help="address /metrics listens on"
    )
    p.add_argument("--liveness-port", type=int, default=8080, help="0 disables /healthz")
    p.add_argument(
        "--liveness-address", default=DEFAULT_BIND_ADDRESS, help="address /healthz listens on"
    )
    p.add_argument(
        "--peering",
        default=None,
        help="kopf peering name for leader election between replicas; "
        "without it the operator runs standalone",
    )
    p.add_argument(
        "--force-delete-after",
        type=float,
        default=10.0,
        help="seconds before a pod stuck terminating on a lost node is force-deleted",
    )
    p.add_argument(
        "--restart-grace",
        type=int,
        default=5,
        help="grace seconds for pods deleted by a restart (maintenance and "
        "preemption restarts give the pod's full grace period)",
    )
    p.add_argument(
        "--collective-timeout",
        type=int,
        default=60,
        help="collective/coordination timeout (s) given the trainer; each medium retry doubles it",
    )
    p.add_argument(
        "--node-not-ready-grace",
        type=float,
        default=DEFAULT_HEALTH.not_ready_grace_seconds,
        help="seconds a node reports Ready!=True before its pods' failure blames it "
        "(a kubelet restart or a PLEG hiccup recovers within it)",
    )
    p.add_argument(
        "--tpu-shortfall-grace",
        type=float,
        default=DEFAULT_HEALTH.tpu_shortfall_grace_seconds,
        help="seconds allocatable google.com/tpu stays below capacity before the "
        "node's TPUs count as failed (a device plugin restart recovers within it)",
    )
    p.add_argument(
        "--lost-node-return",
        type=float,
        default=DEFAULT_HEALTH.lost_node_return_seconds,
        help="seconds a node a job blamed for being lost must stay back (the same Node, Ready, "
        "all TPUs) before that job trusts it again and takes off its mark",
    )
    p.add_argument(
        "--progress-interval",
        type=float,
        default=15.0,
        help="seconds between status writes that would only update a running "
        "job's progress (its heartbeat wakes the job no more often)",
    )
    p.add_argument(
        "--poll",
        type=float,
        default=5.0,
        help="seconds between reconciles of a job in motion (starting, recovering, a pod or "
        "node changing) that no event woke",
    )
    p.add_argument(
        "--steady-poll",
        type=float,
        default=60.0,
        help="at most this many seconds between reconciles of a job that runs steadily; its "
        "events, its heartbeat and its stall deadline wake it earlier",
    )
    p.add_argument(
        "--ledger-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the node ledger's ConfigMap (default: the operator "
        "pod's own); without one the ledger is kept in memory only",
    )
    p.add_argument(
        "--slice-restarts",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="when a failure concerns some slices of a job only, replace only their "
        "pods and restart the others' trainers in place, and after a hang restart every "
        "trainer in its pod (trainers that say on their heartbeat that they can rejoin); "
        "off: every pod is replaced",
    )
    p.add_argument(
        "--host-path-prefixes",
        default=None,
        metavar="PATH,...",
        help="node paths a job's hostPath checkpoint may lie under (comma-separated; empty "
        "allows none). A new job with a hostPath elsewhere is refused in its SpecValid "
        "condition and never launched, whether or not an admission policy runs. Not "
        "given: hostPath is left to the cluster's admission",
    )
    p.add_argument(
        "--trust-job-history",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="namespaces (glob patterns; repeatable) whose jobs' own history may "
        "taint a node: a failure recurring on one node marks it bad for every "
        "job. Elsewhere the job only avoids that node, since a job's author "
        "controls how its program fails; give only namespaces whose code you "
        "trust (on a single-team cluster: '*')",
    )
    p.add_argument(
        "--lease-role",
        default=None,
        help="watching every namespace: the ClusterRole granting Lease writes, which "
        "the operator binds to itself in each namespace it runs a job in",
    )
    p.add_argument(
        "--service-account",
        default=None,
        help="with --lease-role: the operator's ServiceAccount (in POD_NAMESPACE)",
    )
    p.add_argument(
        "--plan-budget",
        type=float,
        default=10.0,
        help="seconds one job's planning (its diagnosis included) may take",
    )
    p.add_argument(
        "--cache-check-seconds",
        type=float,
        default=300.0,
        help="how often to list the uids of the pods, nodes and jobs the operator caches, to "
        "drop those whose deletion a broken watch missed (gone from two lists in a row); 0: never",
    )
    p.add_argument(
        "--gcp-project",
        default=None,
        help="with --gcp-zones: read the Cloud TPU zone catalogue (tpujob[gcp]) to "
        "advise which zones offer a job's shape; advice only",
    )
    p.add_argument(
        "--gcp-zones", default="", help="comma-separated zones of the cluster's TPU node pools"
    )
    p.add_argument("--gcp-refresh-hours", type=float, default=6.0)
    p.add_argument(
        "--kueue",
        action="store_true",
        help="queue jobs that name a Kueue LocalQueue (label kueue.x-k8s.io/queue-name) "
        "through Kueue: each runs only while its Workload is admitted; needs Kueue's CRDs "
        "and TPUTrainingJob.v1alpha1.tpujob.dev in Kueue's integrations.externalFrameworks",
    )
    p.add_argument(
        "--preemption-boost-seconds",
        type=positive_seconds,
        default=PlannerSettings.preemption_boost_seconds,
        help="with --kueue: seconds of work a preemption would lose (steps since the last "
        "committed checkpoint) per point of a running job's Kueue priority boost, at most 10 "
        "points",
    )
    p.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority; replicas with equal priority pause each other, "
        "so by default each replica draws a random one and the highest runs",
    )
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.kubeconfig:
        # kopf's login reads $KUBECONFIG, which the client library reads once at import:
        # set it before anything imports kubernetes, so both use the same credentials.
        os.environ["KUBECONFIG"] = args.kubeconfig
    import kopf
    from prometheus_client import start_http_server

    from tpujob.controller import handlers
    from tpujob.controller.deps import API_THREADS, kopf_connection_limit
    from tpujob.controller.metrics import Metrics
    from tpujob.controller.reconcile import Deps
    from tpujob.controller.wakeups import WakeBook
    from tpujob.kube.apply import ApiWriter
    from tpujob.kube.client import api_client
    from tpujob.kube.observe import Reader

    limit_arenas()  # before any thread starts (the metrics server's, the API threads)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    metrics = Metrics()
    api = api_client(
        args.kubeconfig, on_request=metrics.record_request, connections=API_THREADS + 4
    )
    settings = PlannerSettings(
        poll_seconds=args.poll,
        steady_poll_seconds=args.steady_poll,
        force_delete_after_seconds=args.force_delete_after,
        restart_grace_seconds=args.restart_grace,
        collective_timeout_seconds=args.collective_timeout,
        node_health=NodeHealthSettings(
            not_ready_grace_seconds=args.node_not_ready_grace,
            tpu_shortfall_grace_seconds=args.tpu_shortfall_grace,
            lost_node_return_seconds=args.lost_node_return,
        ),
        trusted_namespaces=tuple(args.trust_job_history),
        slice_restarts=args.slice_restarts,
        preemption_boost_seconds=args.preemption_boost_seconds,
        host_path_prefixes=None
        if args.host_path_prefixes is None
        else tuple(p for p in args.host_path_prefixes.split(",") if p),
    )
    deps = Deps(
        reader=Reader(api),
        writer=ApiWriter(api),
        metrics=metrics,
        settings=settings,
        wakes=WakeBook(progress_interval_seconds=args.progress_interval),
        plan_budget_seconds=args.plan_budget,
        cache_check_seconds=args.cache_check_seconds,
        ledger_namespace=args.ledger_namespace or None,
        catalogue_refresh_seconds=args.gcp_refresh_hours * 3600,
        kopf_connections=kopf_connection_limit(tuple(args.namespace)),
        finalizer=labels.FINALIZER,
        namespaces=tuple(args.namespace),
    )
    # The own watches' streams each hold a connection for as long as they run (a node stream,
    # and a pod and a Lease stream per namespace or for all), and a relist needs one more.
    deps.watch_api = api_client(
        args.kubeconfig,
        on_request=metrics.record_request,
        connections=2 * max(1, len(deps.namespaces)) + 2,
    )
    own_namespace = os.environ.get("POD_NAMESPACE")
    if args.lease_role and args.service_account and own_namespace:
        from tpujob.controller.deps import LeaseAccess

        deps.lease_access = LeaseAccess(
            role=args.lease_role, account=args.service_account, account_namespace=own_namespace
        )
    if args.gcp_project and args.gcp_zones:
        from tpujob.gcp.client import CatalogueConfig, CatalogueSource, parse_zones

        deps.catalogue = CatalogueSource(
            CatalogueConfig(project=args.gcp_project, zones=parse_zones(args.gcp_zones))
        )
    if args.metrics_port:
        start_http_server(
            args.metrics_port, addr=args.metrics_address, registry=deps.metrics.registry
        )
    registry = kopf.OperatorRegistry()
    if args.kueue:
        from tpujob.kube.workloads import WorkloadWriter

        deps.workloads = WorkloadWriter(api)
    handlers.register(registry, kueue=args.kueue)
    namespaces = tuple(args.namespace)

    collector.tune()  # after start-up's allocations, before the event loop's

    async def operate() -> None:
        trimming = asyncio.create_task(trim_memory(TRIM_INTERVAL_SECONDS))
        try:
            await kopf.operator(
                registry=registry,
                memo=deps,
                clusterwide=not namespaces,
                namespaces=namespaces,
                standalone=args.peering is None,
                peering_name=args.peering,
                priority=args.priority if args.priority is not None else random.randint(1, 10**6),
                liveness_endpoint=liveness_url(args.liveness_address, args.liveness_port),
            )
        finally:
            trimming.cancel()

    asyncio.run(operate())
    return 0


async def trim_memory(interval_seconds: float) -> None:
    """Give the memory freed meanwhile back to the system, for as long as the operator runs."""
    while True:
        await asyncio.sleep(interval_seconds)
        trim()
