"""What a node's state means, decided in one place: down now, placeable, lost for good.

Pure. Placement, force-deletion, the diagnosis and the return of a blamed node all read a node
through this module, so they cannot disagree about it. Two questions, two answers:
`down_now` and `placeable` are the instant's readings (is it Ready now, may a slice go there
now); `judge` is the debounced verdict (has its trouble lasted long enough to be a failure),
and `lost` is that verdict's answer to "is it gone".

A single reading of Ready!=True (a kubelet restart, a few seconds of PLEG) or of allocatable
`google.com/tpu` below capacity (a device-plugin restart) is not yet a failure; it becomes one
when it has lasted a grace period. Not-Ready is timed from the Ready condition's
lastTransitionTime; a TPU shortfall, which the Node object does not time, from when the
operator first saw it (`note_tpu_shortfall`), the way the node-lifecycle controller keeps its
own probe times in memory. Signals that are already settled verdicts count at once: the
node-lifecycle controller's unreachable NoExecute taint (set only after its own
node-monitor grace), the out-of-service taint an administrator sets, a Node object gone, and
GKE's maintenance taints and labels. The rules are an ordered table; the first match wins.
See docs/gke-signals.md for the sources of each signal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from tpujob.api import labels
from tpujob.observed.views import NodeView


class NodeTrouble(StrEnum):
    """The verdict on a node, worst first in the rule table."""

    GONE = "Gone"  # the Node object no longer exists
    OUT_OF_SERVICE = "OutOfService"  # node.kubernetes.io/out-of-service taint
    UNREACHABLE = "Unreachable"  # node-lifecycle controller's unreachable NoExecute taint
    NOT_READY = "NotReady"  # Ready!=True for longer than the grace
    MAINTENANCE = "Maintenance"  # GKE maintenance taint or label
    TPU_SHORT = "TPUShort"  # allocatable google.com/tpu below capacity past the grace
    SUSPECT = "Suspect"  # not Ready, or TPUs short, for less than the grace
    NONE = "None"

    @property
    def failure(self) -> bool:
        return self not in (NodeTrouble.SUSPECT, NodeTrouble.NONE)

    @property
    def lost(self) -> bool:
        """The node is gone for its pods: no kubelet will end them."""
        return self in _LOST

    @property
    def broken(self) -> bool:
        """A failure of the node itself (the job blames it), not a planned maintenance."""
        return self.failure and self is not NodeTrouble.MAINTENANCE


_LOST = frozenset(
    {NodeTrouble.GONE, NodeTrouble.OUT_OF_SERVICE, NodeTrouble.UNREACHABLE, NodeTrouble.NOT_READY}
)


def down_now(node: NodeView) -> bool:
    """Not Ready at this instant, or given up on by the node controller or an administrator.

    Not yet a failure (that is `judge`'s), but no slice is placed there and a node blamed for
    being lost is not back while it holds.
    """
    return (
        node.ready != "True"
        or node.has_taint(labels.UNREACHABLE_TAINT)
        or node.has_taint(labels.OUT_OF_SERVICE_TAINT)
    )


def under_maintenance(node: NodeView) -> bool:
    """GKE's maintenance taints or labels: the node is going away on a schedule."""
    return any(node.has_taint(t) for t in labels.MAINTENANCE_TAINTS) or any(
        node.labels.get(k) == v for k, v in labels.MAINTENANCE_LABELS.items()
    )


def tpu_short(node: NodeView) -> bool:
    """Allocatable google.com/tpu below capacity: the device plugin holds chips back now."""
    return node.tpu_capacity > 0 and node.tpu_allocatable < node.tpu_capacity


def placeable(node: NodeView, bad_nodes: frozenset[str] = frozenset()) -> bool:
    """A slice may be placed on the node now: up, whole, not leaving, not marked bad."""
    return not (
        down_now(node)
        or under_maintenance(node)
        or tpu_short(node)
        or node.unschedulable
        or node.name in bad_nodes
        or node.has_taint(labels.BAD_NODE_TAINT)
    )


@dataclass(frozen=True)
class NodeHealthSettings:
    """How long a node's trouble must last before it is a failure."""

    # Ready!=True lasting this long loses the node. The kubelet posts Ready=False at once on
    # a runtime or PLEG hiccup; a restart of it recovers within seconds.
    not_ready_grace_seconds: float = 40.0
    # Allocatable google.com/tpu below capacity this long fails the node's TPUs. A device
    # plugin restart drops allocatable until it re-registers.
    tpu_shortfall_grace_seconds: float = 60.0
    # A node lost (NotReady, unreachable) that comes back as the same Node object, Ready with
    # all its TPUs, is trusted again by the job that blamed it once it has held this long
    # (`tpujob.plan.failed_nodes`). Five minutes is the node-lifecycle controller's 40-s grace
    # several times over: late Lease renewals or a partition lose a node for a while
    # without anything being broken, and a node that holds this long was not.
    lost_node_return_seconds: float = 300.0


DEFAULT_HEALTH = NodeHealthSettings()


@dataclass(frozen=True)
class Verdict:
    trouble: NodeTrouble
    reason: str = ""


@dataclass(frozen=True)
class _Reading:
    node: NodeView
    now: datetime
    settings: NodeHealthSettings
    short_since: datetime | None  # None: unknown, counted as past the grace


def _seconds(since: datetime | None, now: datetime) -> float | None:
    return None if since is None else (now - since).total_seconds()


def _not_ready_past_grace(r: _Reading) -> str | None:
    if r.node.ready == "True":
        return None
    lasted = _seconds(r.node.ready_since, r.now)
    # No transition time: nothing shows the state is fresh, so it is not given the benefit.
    if lasted is None or lasted >= r.settings.not_ready_grace_seconds:
        since = f" for {lasted:.0f}s" if lasted is not None else ""
        return f"node {r.node.name} Ready={r.node.ready}{since}"
    return None


def _tpu_short_past_grace(r: _Reading) -> str | None:
    if not tpu_short(r.node):
        return None
    lasted = _seconds(r.short_since, r.now)
    if lasted is None or lasted >= r.settings.tpu_shortfall_grace_seconds:
        since = f" for {lasted:.0f}s" if lasted is not None else ""
        return (
            f"node {r.node.name} allocatable {labels.TPU_RESOURCE}="
            f"{r.node.tpu_allocatable} of capacity {r.node.tpu_capacity}{since}"
        )
    return None


def _suspect(r: _Reading) -> str | None:
    if r.node.ready != "True":
        return f"node {r.node.name} Ready={r.node.ready}, within the grace"
    if tpu_short(r.node):
        return (
            f"node {r.node.name} allocatable {labels.TPU_RESOURCE}="
            f"{r.node.tpu_allocatable} of {r.node.tpu_capacity}, within the grace"
        )
    return None


def _taint(key: str, effect: str | None, what: str) -> Callable[[_Reading], str | None]:
    def rule(r: _Reading) -> str | None:
        return (
            f"node {r.node.name} tainted {key} ({what})" if r.node.has_taint(key, effect) else None
        )

    return rule


def _maintenance(r: _Reading) -> str | None:
    if not under_maintenance(r.node):
        return None
    shown = [k for k, _ in r.node.taints if k in labels.MAINTENANCE_TAINTS] + [
        f"{k}={v}" for k, v in labels.MAINTENANCE_LABELS.items() if r.node.labels.get(k) == v
    ]
    return f"node {r.node.name}: {', '.join(shown)}"


# Ordered; the first rule that matches gives the verdict. NONE is the default.
RULES: tuple[tuple[NodeTrouble, Callable[[_Reading], str | None]], ...] = (
    (NodeTrouble.OUT_OF_SERVICE, _taint(labels.OUT_OF_SERVICE_TAINT, None, "out of service")),
    (
        NodeTrouble.UNREACHABLE,
        _taint(labels.UNREACHABLE_TAINT, labels.NO_EXECUTE, "the node controller gave up on it"),
    ),
    (NodeTrouble.NOT_READY, _not_ready_past_grace),
    (NodeTrouble.MAINTENANCE, _maintenance),
    (NodeTrouble.TPU_SHORT, _tpu_short_past_grace),
    (NodeTrouble.SUSPECT, _suspect),
)
DEFAULT_VERDICT = Verdict(NodeTrouble.NONE)


def judge(
    node: NodeView | None,
    *,
    now: datetime,
    settings: NodeHealthSettings = DEFAULT_HEALTH,
    tpu_short_since: Mapping[str, datetime] | None = None,
    name: str = "",
) -> Verdict:
    """The verdict on `node` at `now`.

    `tpu_short_since` is the record of `note_tpu_shortfall`; None means no record is kept,
    and a TPU shortfall then counts at once. A node missing from a kept record was short
    for the first time now.
    """
    if node is None:
        return Verdict(NodeTrouble.GONE, f"node {name} no longer exists")
    since = None if tpu_short_since is None else tpu_short_since.get(node.name, now)
    reading = _Reading(node, now, settings, since)
    for trouble, rule in RULES:
        reason = rule(reading)
        if reason is not None:
            return Verdict(trouble, reason)
    return DEFAULT_VERDICT


def lost(
    node: NodeView | None, *, now: datetime, settings: NodeHealthSettings = DEFAULT_HEALTH
) -> bool:
    """The node is gone for its pods (its verdict says so, past the grace): a pod stuck
    terminating there will not be ended by a kubelet, and does not hold up the next attempt."""
    return judge(node, now=now, settings=settings).trouble.lost


def note_tpu_shortfall(
    previous: Mapping[str, datetime], name: str, node: NodeView | None, *, now: datetime
) -> Mapping[str, datetime]:
    """The next record of when each node's TPU shortfall began, after a watch event showed
    node `name` as `node` (None: the node is gone).

    A node short now keeps its earlier time (or gets `now`); a node that recovered, or that
    is gone, is dropped, so a flap restarts its grace. The same record when nothing changed,
    else a new one (a record handed to a plan is never changed).
    """
    short = node is not None and tpu_short(node)
    if short == (name in previous):
        return previous
    record = dict(previous)
    if short:
        record[name] = now
    else:
        del record[name]
    return record
