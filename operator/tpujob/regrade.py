"""`tpujob regrade NAMESPACE/JOB --class C --why TEXT`: teach the cluster a failure's grade.

The people running a cluster know its failures: a storage sidecar that restarts every night,
a library error that is always the user's. A regrade records the job's last failure, by the
signature the engine gave it, as a site rule (`tpujob.diagnosis.site`) with its class, why
and date, in the `tpujob-site-rules` ConfigMap of the operator's namespace, which only who may
edit ConfigMaps there can write. The operator reads it within seconds
(`tpujob.controller.sweeps.refresh_site_rules`) and grades the same failure in every job by
it from then on; `tpujob describe` says "site rule 'X', set DATE: why".

A regrade of a failure already ruled replaces that rule (the same signature has one grade).
The set is validated whole before it is written, as the operator validates it when read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import sys
from typing import Any

import yaml

from tpujob.api import GROUP, PLURAL, VERSION, FailureClass
from tpujob.diagnosis.site import (
    SITE_FORMAT_VERSION,
    SITE_RULES_CONFIGMAP,
    SITE_RULES_KEY,
    SiteRulesError,
    parse_site_rules,
)
from tpujob.kube.errors import KubeError, NotFoundError, call
from tpujob.kubeconfig import connect

DEFAULT_OPERATOR_NAMESPACE = "tpujob-system"


class RegradeError(RuntimeError):
    """The regrade cannot be made; the message says why and what to do."""


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "regrade",
        help="record a job's last failure with the class it should have, for every job",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    p.add_argument("job", metavar="NAMESPACE/JOB")
    p.add_argument("--class", dest="failure_class", required=True, choices=list(FailureClass))
    p.add_argument("--why", required=True, help="why this class: shown with every regrade")
    p.add_argument("--name", help="the rule's name (default: derived from the job)")
    p.add_argument(
        "--operator-namespace",
        default=DEFAULT_OPERATOR_NAMESPACE,
        help="where the operator keeps its ConfigMaps (the chart's release namespace)",
    )
    p.add_argument("--kubeconfig", default=None)
    p.set_defaults(handler=run)


def last_failure_signature(job: dict[str, Any]) -> tuple[str, str]:
    """The signature and code of the job's last failure, as its status recorded them."""
    history = (job.get("status") or {}).get("failureHistory") or []
    if not history or not history[-1].get("signature"):
        raise RegradeError("the job has no recorded failure to regrade")
    last = history[-1]
    return str(last["signature"]), str(last.get("code") or "")


def with_rule(document: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    """`document` (a site rule set) with `rule` added, replacing any rule of its name or
    signature; validated whole."""
    rules = [
        r
        for r in document.get("rules") or []
        if isinstance(r, dict)
        and r.get("name") != rule["name"]
        and r.get("signature") != rule["signature"]
    ]
    updated = {"version": SITE_FORMAT_VERSION, "rules": [*rules, rule]}
    parse_site_rules(updated)
    return updated


def site_rule(
    job: dict[str, Any], failure_class: str, why: str, *, name: str | None, today: dt.date
) -> dict[str, Any]:
    signature, code = last_failure_signature(job)
    meta = job["metadata"]
    digest = signature.rpartition(":")[2][:8]
    rule: dict[str, Any] = {
        "name": name or f"{meta['namespace']}-{meta['name']}-{digest}"[:63],
        "class": failure_class,
        "why": why,
        "set": today.isoformat(),
        "signature": signature,
    }
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = ""
    if user:
        rule["set_by"] = user
    if code:
        rule["code"] = code
    return rule


def run(args: argparse.Namespace) -> int:
    from kubernetes import client

    namespace, _, name = str(args.job).partition("/")
    if not namespace or not name:
        print("regrade: give the job as NAMESPACE/JOB", file=sys.stderr)
        return 2
    cluster = connect(args.kubeconfig, None)
    custom, core = client.CustomObjectsApi(cluster.api), client.CoreV1Api(cluster.api)
    try:
        job = call(custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)
        rule = site_rule(
            job, args.failure_class, args.why, name=args.name, today=dt.datetime.now(dt.UTC).date()
        )
        _save(core, args.operator_namespace, rule)
    except NotFoundError as err:
        print(f"regrade: not found: {err.message}", file=sys.stderr)
        return 1
    except (RegradeError, SiteRulesError) as err:
        print(f"regrade: {err}", file=sys.stderr)
        return 1
    except KubeError as err:
        raise cluster.explain(err) from err
    print(
        f"site rule '{rule['name']}': {rule['signature']} is {rule['class']} from now on "
        f"({args.operator_namespace}/{SITE_RULES_CONFIGMAP})"
    )
    return 0


def _save(core: Any, namespace: str, rule: dict[str, Any]) -> None:
    """Read, add, validate and write the set; the write carries the read's resourceVersion,
    so two regrades at once never lose one (the second is refused and says so)."""
    try:
        found = call(core.read_namespaced_config_map, SITE_RULES_CONFIGMAP, namespace)
    except NotFoundError:
        found = None
    text = ((found.data or {}) if found is not None else {}).get(SITE_RULES_KEY) or ""
    document = yaml.safe_load(text) or {}
    if not isinstance(document, dict):
        raise RegradeError(f"{namespace}/{SITE_RULES_CONFIGMAP} does not hold a rule set")
    data = {SITE_RULES_KEY: yaml.safe_dump(with_rule(document, rule), sort_keys=False)}
    if found is None:
        body = {"metadata": {"name": SITE_RULES_CONFIGMAP, "namespace": namespace}, "data": data}
        call(core.create_namespaced_config_map, namespace, body)
        return
    patch = {"metadata": {"resourceVersion": found.metadata.resource_version}, "data": data}
    call(core.patch_namespaced_config_map, SITE_RULES_CONFIGMAP, namespace, patch)
