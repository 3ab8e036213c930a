"""What the operator does on its own clock, beside the reconciles: tasks of their own, each a
loop that lives as long as the operator and never holds a reconcile.

* `refresh_catalogue`: keeps the optional Cloud TPU zone catalogue fresh (a slow or
  unreachable Cloud TPU API never delays a job);
* `refresh_site_rules`: reads the cluster's site rules (`tpujob regrade` writes them) from a
  ConfigMap in the operator's namespace; a set that does not parse is refused whole and the
  last good one kept;
* `clear_orphaned_marks`: takes off the marks of lost nodes whose job is gone, once the node
  has been back long enough (`tpujob.plan.marks.orphaned_marks`); only the job that made a
  mark takes it off otherwise, and a job deleted first would leave the node marked forever;
* `check_for_ghosts`: lists the uids of the pods, nodes and jobs the cache holds and drops
  those the cluster no longer has, whose deletion a broken watch missed (`tpujob.kube.ghosts`).
"""

from __future__ import annotations

import asyncio
import logging
import time

import yaml

from tpujob.controller.deps import Deps
from tpujob.diagnosis.site import (
    SITE_RULES_CONFIGMAP,
    SITE_RULES_KEY,
    SiteRulesError,
    parse_site_rules,
)
from tpujob.kube.errors import ForbiddenError, KubeError
from tpujob.plan.marks import orphaned_marks

log = logging.getLogger("tpujob.controller.sweeps")
# Nodes come back over minutes (`lost_node_return_seconds`, 300 s): a minute late is nothing,
# and each sweep reads only the cache.
ORPHAN_SWEEP_SECONDS = 60.0
# A regrade takes effect within this long in every job's next failure.
SITE_RULES_REFRESH_SECONDS = 15.0


async def refresh_catalogue(deps: Deps) -> None:
    """Keep the zone catalogue fresh for as long as the operator runs."""
    source = deps.catalogue
    if source is None:
        return
    while True:
        await deps.run(source.refresh)
        await asyncio.sleep(deps.catalogue_refresh_seconds)


async def refresh_site_rules(deps: Deps) -> None:
    """Read the site rules every `SITE_RULES_REFRESH_SECONDS`, for as long as the operator runs."""
    while True:
        await read_site_rules(deps)
        await asyncio.sleep(SITE_RULES_REFRESH_SECONDS)


async def read_site_rules(deps: Deps) -> None:
    """One read: the rules in force from now on. No ConfigMap, or no operator namespace, is
    no rule; one that cannot be read or parsed leaves the last good set in force."""
    namespace = deps.ledger_namespace
    if namespace is None:
        return
    try:
        data = await deps.run(deps.reader.config_data, namespace, SITE_RULES_CONFIGMAP)
        rules = parse_site_rules(yaml.safe_load(data.get(SITE_RULES_KEY) or ""))
    except (KubeError, yaml.YAMLError, SiteRulesError) as err:
        log.warning(
            "site rules %s/%s not read, the last set kept: %s", namespace, SITE_RULES_CONFIGMAP, err
        )
        return
    if rules != deps.site_rules:
        log.info("site rules: %d in force", len(rules))
    deps.site_rules = rules


async def clear_orphaned_marks(deps: Deps) -> None:
    """Sweep for orphaned marks every `ORPHAN_SWEEP_SECONDS`, for as long as the operator runs.
    The first sweep waits one period, by which time the job index has had its first listing
    (a job missing from it would look gone)."""
    while True:
        await asyncio.sleep(ORPHAN_SWEEP_SECONDS)
        await sweep_orphaned_marks(deps)


async def sweep_orphaned_marks(deps: Deps) -> list[str]:
    """One sweep: the nodes whose orphaned mark was taken off."""
    view = deps.view
    if view is None:
        return []
    marks = orphaned_marks(
        view.node_views().values(),
        frozenset(key for key in view.jobs if isinstance(key, tuple)),
        now=deps.clock(),
        return_after=deps.settings.node_health.lost_node_return_seconds,
    )
    cleared = []
    for mark in marks:
        try:
            await deps.run(deps.writer.mark_node, mark, "")
        except KubeError as err:  # the next sweep tries again
            log.warning("node %s: could not take off the mark %r: %s", mark.node, mark.reason, err)
            continue
        log.info("node %s: took off the mark of a job that is gone (%s)", mark.node, mark.reason)
        cleared.append(mark.node)
    return cleared


async def check_for_ghosts(deps: Deps) -> None:
    """Check the cache for ghosts every `Deps.cache_check_seconds`, for as long as the
    operator runs (0: never)."""
    if deps.cache_check_seconds <= 0:
        return
    while True:
        await asyncio.sleep(deps.cache_check_seconds)
        await find_ghosts(deps)


async def find_ghosts(deps: Deps) -> None:
    """One check: list what the cache holds and note the ghosts (`tpujob.kube.ghosts`); wake
    the jobs whose pods, nodes or selves turned out to be ghosts, so they see it at once."""
    view = deps.view
    if view is None:
        return
    cached = view.cached_uids()  # before the lists: see `GhostFinder` for why either order works
    try:
        pods = await _list(deps, "pods", cached.pod_namespaces)
        nodes = await _list(deps, "nodes", frozenset())
        jobs = await _list(deps, "jobs", cached.job_namespaces)
    except KubeError as err:  # a list that failed proves nothing gone; the next check tries
        log.warning("cache check: could not list what exists, checked again later: %s", err)
        return
    checks = (
        ("pods", view.ghosts.pods, cached.pods, pods),
        ("nodes", view.ghosts.nodes, cached.nodes, nodes),
        ("jobs", view.ghosts.jobs, cached.jobs, jobs),
    )
    found = False
    for kind, finder, held, listed in checks:
        before = finder.ghosts
        if finder.compare(held, listed) - before:
            found = True
            log.warning(
                "cache: dropped %d %s the cluster no longer has (their deletion was missed"
                " while a watch was down)",
                len(finder.ghosts),
                kind if len(finder.ghosts) != 1 else kind.removesuffix("s"),
            )
    now = time.monotonic()
    for key in view.jobs_with_ghosts() if found else ():
        deps.wakes.wake(key, at=now)


async def _list(deps: Deps, kind: str, namespaces: frozenset[str]) -> frozenset[str]:
    """The uids of `kind` that exist: one list of the whole cluster, or, where the operator
    may list only the namespaces it serves, one per namespace the cache holds some in."""
    try:
        return await deps.run(deps.reader.uids, kind, ())
    except ForbiddenError:
        if not namespaces:
            raise
        return await deps.run(deps.reader.uids, kind, tuple(sorted(namespaces)))
