"""`tpujob get [JOB]` and `tpujob describe JOB`: the job's state for people (tables, rich) and
scripts (`-o json|yaml`), with kubectl's options and defaults.

Reads the job's status only; everything shown was written there by the operator. Without `-n`
both read the kubeconfig context's namespace, as kubectl does; `get -A` reads every namespace.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from rich.console import Console
from rich.markup import escape

from tpujob.api import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    ConditionStatus,
    ConditionType,
    GoodputBreakdown,
    Phase,
    TPUTrainingJob,
    parse_job,
)
from tpujob.api.status import QueueStatus
from tpujob.cli_output import (
    JSON,
    WIDE,
    YAML,
    CommandError,
    add_output_option,
    print_data,
    print_table,
)
from tpujob.gcp.catalogue import Catalogue, FindingLevel, check_shape
from tpujob.kube.errors import KubeError, NotFoundError, call
from tpujob.kubeconfig import Cluster, add_cluster_options, connect


def register(subparsers: Any) -> None:
    get = subparsers.add_parser("get", help="list TPUTrainingJobs with phase, step, restarts")
    get.add_argument("job", nargs="?", help="just this job")
    add_cluster_options(get, namespaced=True)
    get.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the jobs of every namespace"
    )
    add_output_option(get, (JSON, YAML, WIDE))
    get.set_defaults(handler=_get)
    describe = subparsers.add_parser("describe", help="one job: progress, failures, timeline")
    describe.add_argument("job")
    add_cluster_options(describe, namespaced=True)
    add_output_option(describe, (JSON, YAML))
    describe.add_argument(
        "--project",
        default=None,
        help="warn when no zone of the Cloud TPU catalogue offers the shape",
    )
    describe.add_argument("--zones", default="", help="comma-separated zones to check")
    describe.set_defaults(handler=_describe)


def _custom(cluster: Cluster) -> Any:
    return client.CustomObjectsApi(cluster.api)


def read_job(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The job's object as the API returns it; a missing job is said as kubectl says it."""
    try:
        body: dict[str, Any] = call(
            _custom(cluster).get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name
        )
    except NotFoundError as err:
        raise CommandError(f'{KIND} "{name}" not found in namespace "{namespace}"') from err
    except KubeError as err:
        raise cluster.explain(err) from err
    return body


def _age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return "-"
    seconds = int((now - since).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def job_row(job: TPUTrainingJob) -> dict[str, Any]:
    st = job.status
    return {
        "namespace": job.namespace,
        "name": job.name,
        "phase": str(st.phase or "Pending"),
        "step": st.progress.step if st.progress else None,
        "totalSteps": st.progress.total_steps if st.progress else None,
        "restarts": st.restarts.model_dump(by_alias=True),
        "goodput": st.goodput,
        "attempt": st.attempt,
        "failedNodes": [n.name for n in st.failed_nodes],
        "nodePools": list(dict.fromkeys(p.node_pool for p in st.current_attempt.placement)),
        "lastFailure": st.last_failure.code if st.last_failure else None,
    }


def get_columns(*, namespaces: bool, wide: bool) -> list[str]:
    """kubectl's layout: NAMESPACE only across namespaces, more columns with `-o wide`."""
    columns = ["NAME", "PHASE", "STEP", "RESTARTS (s/m/h)", "GOODPUT"]
    if wide:
        columns += ["ATTEMPT", "NODE POOLS", "LAST FAILURE"]
    return ["NAMESPACE", *columns] if namespaces else columns


def get_cells(job: TPUTrainingJob, *, namespaces: bool, wide: bool) -> list[str]:
    """One job's line of the `get` table, in the order of `get_columns`."""
    row = job_row(job)
    r = row["restarts"]
    step = f"{row['step']}/{row['totalSteps'] or '?'}" if row["step"] is not None else "-"
    goodput = f"{row['goodput']:.0%}" if row["goodput"] is not None else "-"
    cells = [row["name"], row["phase"], step, f"{r['soft']}/{r['medium']}/{r['hard']}", goodput]
    if wide:
        cells += [str(row["attempt"]), ",".join(row["nodePools"]) or "-", row["lastFailure"] or "-"]
    return [row["namespace"], *cells] if namespaces else cells


def _get(args: argparse.Namespace) -> int:
    if args.job and args.all_namespaces:
        raise CommandError("a job cannot be got by name across all namespaces")
    cluster = connect(args.kubeconfig, args.context)
    namespace = args.namespace or cluster.namespace
    api = _custom(cluster)
    if args.job:
        body = read_job(cluster, namespace, args.job)
        items = [body]
    elif args.all_namespaces:
        body = cluster.call(api.list_cluster_custom_object, GROUP, VERSION, PLURAL)
        items = body["items"]
    else:
        body = cluster.call(api.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)
        items = body["items"]
    if args.output in (JSON, YAML):
        print_data(body, args.output)
        return 0
    if not items:
        where = "" if args.all_namespaces else f" in {namespace} namespace"
        print(f"No {KIND}s found{where}.", file=sys.stderr)
        return 0
    shown = {"namespaces": bool(args.all_namespaces), "wide": args.output == WIDE}
    print_table(get_columns(**shown), [get_cells(parse_job(i), **shown) for i in items])
    return 0


def catalogue_warnings(job: TPUTrainingJob, catalogue: Catalogue | None) -> list[str]:
    """A warning line when the catalogue's zones offer the job's shape nowhere; never blocks.

    Without a catalogue of its own (`--project`), describe repeats what the operator's
    catalogue said (the job's ShapeOffered condition)."""
    if catalogue is None:
        told = job.status.condition(ConditionType.SHAPE_OFFERED)
        if told is None or told.status != ConditionStatus.FALSE:
            return []
        message = f"{told.message or 'shape offered in no zone'} (the operator's catalogue)"
    else:
        check = check_shape(catalogue, job.spec.tpu.accelerator, job.spec.tpu.topology)
        if check.level is not FindingLevel.WARNING:
            return []
        message = check.message
    return [f"[yellow]warning: {escape(message)}[/yellow]"]


def goodput_parts(parts: GoodputBreakdown) -> list[tuple[str, float]]:
    """The breakdown's categories in a fixed order, with their names as users read them."""
    return [
        ("productive", parts.productive),
        ("start-up", parts.startup),
        ("restore", parts.restore),
        ("re-done", parts.redone),
        ("data wait", parts.data_wait),
        ("downtime", parts.downtime),
        ("queued", parts.queued),
        ("other", parts.other),
    ]


def false_conditions(job: TPUTrainingJob) -> list[str]:
    """Every condition whose status is False, with its reason and message: why a job is not
    running (waiting for a pool, its pods refused, its spec invalid) is said there."""
    unmet = [c for c in job.status.conditions if c.status == ConditionStatus.FALSE]
    if not unmet:
        return []
    width = max(len(c.type) for c in unmet)
    return ["[bold]conditions False[/bold]"] + [
        f"  {escape(c.type):<{width}}  {escape(c.reason or '-')}"
        + (f": {escape(c.message)}" if c.message else "")
        for c in unmet
    ]


def queue_line(queue: QueueStatus, now: datetime) -> str:
    """A job's Kueue queue: admitted where, or waiting since when; its evictions."""
    if queue.admitted:
        where = f"admitted by ClusterQueue {queue.cluster_queue}"
    elif queue.waiting_since is not None:
        where = f"waiting for admission for {_age(queue.waiting_since, now)}"
    else:
        where = "not admitted"
    line = f"{queue.name}: {where}"
    if queue.evictions:
        line += f"; evicted {queue.evictions}x, last: {queue.last_eviction}"
    if queue.queued_seconds:
        line += f"; queued {queue.queued_seconds:.0f}s after its start"
    return line


def _elastic(job: TPUTrainingJob) -> str:
    """The TPU line's tail for an elastic job: its floor, and the slices it runs on now."""
    if job.spec.elastic is None:
        return ""
    tail = f", elastic down to {job.spec.elastic.min_slices}"
    running = job.status.current_attempt.slices
    if running is not None and job.status.phase not in (Phase.SUCCEEDED, Phase.FAILED):
        tail += f"; [yellow]on {running} of {job.spec.tpu.slices} slices now[/yellow]"
    return tail


def describe_lines(
    job: TPUTrainingJob, now: datetime, catalogue: Catalogue | None = None
) -> list[str]:
    """The describe view as plain lines (rich markup allowed)."""
    st, spec = job.status, job.spec
    lines = [
        f"[bold]{job.namespace}/{job.name}[/bold]  phase [bold]{st.phase or 'Pending'}"
        f"[/bold]  attempt {st.attempt}  age {_age(st.start_time, now)}",
        f"  TPU        {spec.tpu.accelerator} {spec.tpu.topology} x{spec.tpu.slices} "
        f"({spec.tpu.total_hosts} hosts)" + _elastic(job),
    ]
    if st.progress and st.progress.step is not None:
        total = st.progress.total_steps
        pct = f" ({st.progress.step / total:.0%})" if total else ""
        loss = f", loss {st.progress.loss:.4g}" if st.progress.loss is not None else ""
        lines.append(
            f"  progress   step {st.progress.step}/{total or '?'}{pct}, "
            f"{st.progress.steps_per_second or 0:.2f} steps/s{loss}"
        )
    checkpoint = st.checkpoint_step if st.checkpoint_step is not None else "-"
    lines.append(f"  checkpoint step {checkpoint}")
    cadence = st.condition(ConditionType.CHECKPOINT_CADENCE)
    if cadence is not None and cadence.status == ConditionStatus.TRUE and cadence.message:
        # A False one is shown with the other unmet conditions.
        lines.append(f"  cadence    {escape(cadence.message)}")
    if st.goodput is not None:
        lines.append(f"  goodput    {st.goodput:.1%}")
    if (parts := st.goodput_breakdown) is not None and parts.wall_seconds > 0:
        lines.append(
            "  wall time  "
            + ", ".join(
                f"{name} {seconds:.0f}s ({seconds / parts.wall_seconds:.0%})"
                for name, seconds in goodput_parts(parts)
                if seconds > 0
            )
        )
        if parts.degraded > 0:
            lines.append(f"  degraded   {parts.degraded:.0f}s on fewer slices than asked for")
    r = st.restarts
    rec = spec.recovery
    lines.append(
        f"  restarts   soft {r.soft}/{rec.max_soft_restarts}  medium "
        f"{r.medium}/{rec.max_medium_restarts}  hard {r.hard}/{rec.max_hard_restarts}"
    )
    failed = (
        ", ".join(
            n.name + (" (avoided by this job only)" if n.job_only else "") for n in st.failed_nodes
        )
        or "none"
    )
    lines.append(f"  bad nodes  {failed} (budget left {st.failed_node_budget_left})")
    if st.current_attempt.placement:
        lines.append(
            "  placement  "
            + ", ".join(f"slice {p.slice} on {p.node_pool}" for p in st.current_attempt.placement)
        )
    if job.spec.tpu.spares or st.spares:
        held = ", ".join(
            f"{escape(s.node_pool)} ({'ready' if s.ready else 'starting'})" for s in st.spares
        )
        lines.append(
            f"  spares     {len(st.spares)} of {job.spec.tpu.spares}: {held or 'none free'}"
        )
    if (queue := st.queue) is not None:
        lines.append(f"  queue      {escape(queue_line(queue, now))}")
    lines += false_conditions(job)
    lf = st.last_failure
    if lf is not None:
        tag = escape(f"[{str(lf.failure_class or '').upper()}]")
        lines.append(f"[bold]last failure[/bold] {tag} {escape(f'{lf.code}: {lf.summary}')}")
        lines += [f"    {'->' if i else '  '} {escape(link)}" for i, link in enumerate(lf.chain)]
        lines += [f"    evidence: {escape(e)}" for e in lf.evidence[:6]]
        if lf.advice:
            lines.append(f"    advice: {escape(lf.advice)}")
        if lf.action:
            lines.append(f"    action: {escape(lf.action)}")
    if st.timeline:
        lines.append("[bold]timeline[/bold]")
        lines += [
            f"  {e.time.strftime('%H:%M:%S')} {e.kind:<13} {escape(e.message)}"
            for e in st.timeline[-20:]
        ]
    for cond in st.conditions:
        if cond.type == "Failed" and cond.status == "True":
            lines.append(f"[red]failed: {escape(cond.message or '')}[/red]")
    return lines + catalogue_warnings(job, catalogue)


def _describe(args: argparse.Namespace) -> int:
    cluster = connect(args.kubeconfig, args.context)
    body = read_job(cluster, args.namespace or cluster.namespace, args.job)
    job = parse_job(body)
    if args.output in (JSON, YAML):
        print_data({**job_row(job), "status": body.get("status", {})}, args.output)
        return 0
    catalogue = None
    if args.project:
        from tpujob.gcp.client import CatalogueConfig, CatalogueSource, parse_zones

        catalogue = CatalogueSource(
            CatalogueConfig(project=args.project, zones=parse_zones(args.zones))
        ).refresh()
    console = Console()
    for line in describe_lines(job, datetime.now(UTC), catalogue):
        console.print(line, highlight=False)
    return 0
