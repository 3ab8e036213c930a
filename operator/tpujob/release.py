"""`tpujob release-jobs`: hand every job back before the operator is uninstalled.

Each TPUTrainingJob carries the operator's finalizer, so that its deletion waits for the
operator's clean-up. Once the operator is gone nothing removes it: deleting a job, its
namespace or the CRD waits for ever. The chart runs this command as a pre-delete hook: it
scales the operator's Deployment to zero, waits until no replica is left (a running one would
put the finalizer back at its next event), then removes the finalizer from every job in the
namespaces the operator watched. Jobs and their pods are left as they are: training goes on
until the jobs are deleted, and deleting them (or the CRD) then completes at once, the pods
going with them by their owner references.

A node the operator marked bad keeps its mark: it was found broken, and a node's mark is for
the cluster's people to clear (`kubectl taint nodes NODE tpujob.dev/unhealthy-`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from tpujob.api import GROUP, PLURAL, VERSION
from tpujob.api.labels import FINALIZER
from tpujob.cli_output import CommandError

# How long to wait for the operator's replicas to go: their grace period and a margin.
STOP_TIMEOUT_SECONDS = 120.0
CONFLICT_RETRIES = 5


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "release-jobs",
        help="before uninstalling: stop the operator and remove its finalizer from every job",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("--deployment", required=True, help="the operator's Deployment")
    p.add_argument(
        "--deployment-namespace", required=True, help="the namespace of the operator's Deployment"
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--namespace", action="append", dest="namespaces", help="a namespace it watched"
    )
    where.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("--timeout", type=float, default=STOP_TIMEOUT_SECONDS)
    p.add_argument("--kubeconfig", default=None)
    p.set_defaults(handler=run)


def without_finalizer(finalizers: Iterable[str]) -> list[str]:
    return [f for f in finalizers if f != FINALIZER]


def release_job(custom: Any, namespace: str, name: str) -> bool:
    """Remove the operator's finalizer from one job; False if it had none (or is gone).

    The patch names the resourceVersion it read, so a finalizer another controller adds in
    between is not lost: a conflict reads the job again."""
    from tpujob.kube.apply import MERGE_PATCH
    from tpujob.kube.errors import ConflictError, NotFoundError, call

    for _ in range(CONFLICT_RETRIES):
        # A list by name, not a get: the operator's ServiceAccount, which the chart's hook
        # runs as, may list jobs and never needed a get.
        found = call(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            field_selector=f"metadata.name={name}",
        ).get("items")
        if not found:
            return False
        job = found[0]
        meta = job["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        if FINALIZER not in finalizers:
            return False
        patch = {
            "metadata": {
                "finalizers": without_finalizer(finalizers),
                "resourceVersion": meta["resourceVersion"],
            }
        }
        try:
            call(
                custom.patch_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                patch,
                _content_type=MERGE_PATCH,
            )
        except NotFoundError:
            return False
        except ConflictError:
            continue
        return True
    raise CommandError(f"{namespace}/{name}: changed by others {CONFLICT_RETRIES} times; run again")


def stop_operator(
    apps: Any,
    core: Any,
    namespace: str,
    deployment: str,
    *,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Scale the Deployment to zero and wait until none of its pods is left."""
    from tpujob.kube.apply import MERGE_PATCH
    from tpujob.kube.errors import NotFoundError, call

    try:
        found = call(apps.read_namespaced_deployment, deployment, namespace)
    except NotFoundError:
        return  # already gone: nothing can put a finalizer back
    call(
        apps.patch_namespaced_deployment_scale,
        deployment,
        namespace,
        {"spec": {"replicas": 0}},
        _content_type=MERGE_PATCH,
    )
    selector = ",".join(f"{k}={v}" for k, v in (found.spec.selector.match_labels or {}).items())
    deadline = clock() + timeout
    while True:
        left = call(core.list_namespaced_pod, namespace, label_selector=selector).items
        if not left:
            return
        if clock() >= deadline:
            names = ", ".join(sorted(p.metadata.name for p in left))
            raise CommandError(f"the operator's pods did not stop within {timeout:.0f}s: {names}")
        sleep(1.0)


def _jobs(custom: Any, namespaces: list[str] | None) -> tuple[list[tuple[str, str]], list[str]]:
    """The jobs to release, and the watched namespaces that could not be read.

    A watched namespace deleted before the uninstall took its jobs and the operator's Role
    there with it: listing it is refused, and there is nothing left in it to release. It is
    named, not fatal, so one gone namespace does not stop the uninstall."""
    from tpujob.kube.errors import ForbiddenError, NotFoundError, call

    if namespaces is None:
        listed = [call(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)]
        skipped: list[str] = []
    else:
        listed, skipped = [], []
        for ns in namespaces:
            try:
                listed.append(
                    call(custom.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL)
                )
            except (ForbiddenError, NotFoundError):
                skipped.append(ns)
    jobs = [
        (item["metadata"]["namespace"], item["metadata"]["name"])
        for body in listed
        for item in body.get("items") or []
    ]
    return jobs, skipped


def run(args: argparse.Namespace) -> int:
    from kubernetes import client

    from tpujob.kube.errors import KubeError
    from tpujob.kubeconfig import connect

    cluster = connect(args.kubeconfig, None)
    api = cluster.api
    custom = client.CustomObjectsApi(api)
    try:
        stop_operator(
            client.AppsV1Api(api),
            client.CoreV1Api(api),
            args.deployment_namespace,
            args.deployment,
            timeout=args.timeout,
        )
        jobs, skipped = _jobs(custom, None if args.all_namespaces else args.namespaces)
        released = [job for job in jobs if release_job(custom, *job)]
    except KubeError as err:
        raise cluster.explain(err) from err
    for namespace in skipped:
        print(f"namespace {namespace}: jobs cannot be listed (deleted?); skipped", file=sys.stderr)
    print(f"operator stopped; finalizer removed from {len(released)} of {len(jobs)} jobs")
    for namespace, name in released:
        print(f"  {namespace}/{name}")
    return 0
