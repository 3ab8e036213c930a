"""CEL admission rules generated from the TPU topology table.

Pure functions from `tpujob.api.topology` to `x-kubernetes-validations` entries, so the table in
one module decides both what the models accept and what the apiserver accepts. Each message
names the field and lists what is allowed, because the message is all a user sees from
`kubectl apply`.
"""

from __future__ import annotations

import json

from pydantic.config import JsonDict

from tpujob.api import topology
from tpujob.api.base import cel


def _literal(values: object) -> str:
    # JSON string and list literals are valid CEL literals; single quotes are not needed.
    return json.dumps(values)


def topology_rules() -> list[JsonDict]:
    """One rule per accelerator: its topology must be one the table lists for it."""
    rules = []
    for row in topology.ACCELERATORS:
        allowed = list(row.chips_per_host)
        rules.append(
            cel(
                f"self.accelerator != {_literal(row.label)}"
                f" || self.topology in {_literal(allowed)}",
                f"topology is not offered for accelerator {row.label}; "
                f"allowed: {', '.join(allowed)}",
                field_path=".topology",
            )
        )
    return rules


def single_host_pairs() -> list[tuple[str, str]]:
    """(accelerator, topology) pairs whose slice is one VM."""
    return [(s.accelerator, s.topology) for s in topology.all_shapes() if not s.multi_host]


def multislice_rule() -> JsonDict:
    """More than one slice needs multi-host slices (GKE multislice works across node pools)."""
    by_accelerator: dict[str, list[str]] = {}
    for label, topo in single_host_pairs():
        by_accelerator.setdefault(label, []).append(topo)
    single = " || ".join(
        f"(self.accelerator == {_literal(label)} && self.topology in {_literal(topos)})"
        for label, topos in by_accelerator.items()
    )
    listed = "; ".join(f"{label} {', '.join(topos)}" for label, topos in by_accelerator.items())
    return cel(
        f"self.slices <= 1 || !({single})",
        "slices > 1 (multislice) needs a multi-host topology; single-host topologies are: "
        + listed,
        field_path=".slices",
    )


def hosts_map() -> dict[str, int]:
    """ "accelerator/topology" -> hosts per slice, the source of a CEL map literal."""
    return {f"{s.accelerator}/{s.topology}": s.hosts for s in topology.all_shapes()}


def failed_node_budget_rule() -> JsonDict:
    """An integer maxFailedNodes may be at most half the job's hosts, rounded up.

    The percentage form is bounded on the field itself; this rule needs the host count, which
    only the spec knows (hosts per slice from the table, times slices).
    """
    # An unknown pair is the topology rules' to refuse; a huge host count passes it here so
    # the user sees one error, not two. (cel.bind is not offered to CRD rules, hence the
    # optional index instead of a named lookup.)
    hosts = (
        f"{_literal(hosts_map())}[?(self.tpu.accelerator + '/' + self.tpu.topology)]"
        f".orValue({2**31})"
    )
    return cel(
        "!has(self.recovery) || !has(self.recovery.maxFailedNodes)"
        " || type(self.recovery.maxFailedNodes) == string"
        f" || 2 * int(self.recovery.maxFailedNodes) <= {hosts} * self.tpu.slices + 1",
        "maxFailedNodes may be at most half of the job's hosts, rounded up "
        "(hosts = hosts per slice of the topology x slices); use a percentage up to 50%",
        field_path=".recovery.maxFailedNodes",
    )
