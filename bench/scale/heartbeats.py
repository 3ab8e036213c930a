"""Whether the fake nodes kept their heartbeats: kwok's Lease renewals read back from its log.

kwok renews each node's Lease every quarter of its duration. On a saturated machine it falls
behind, and a renewal later than the controller-manager's node-monitor grace gets the node
marked unreachable and tainted: a node failure the benchmark did not mean to inject, which a
controller that reacts to lost nodes (tpujob) pays for and one that waits out the taint's
300 s toleration (JobSet, the Job controller) does not. Each run records the gaps, so such a
run says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from scale.stats import dist

RENEWALS = ("Syncing lease", "Creating lease")


def gaps(lines: Iterable[str]) -> list[tuple[str, float]]:
    """(node, seconds since its Lease's renewal before) for each renewal, from kwok's JSON log
    lines."""
    last: dict[str, datetime] = {}
    found: list[tuple[str, float]] = []
    for line in lines:
        if not any(r in line for r in RENEWALS):  # most lines are about pods: skip the parse
            continue
        try:
            entry = json.loads(line)
            node, at = entry["node"], datetime.fromisoformat(entry["time"])
        except (ValueError, KeyError, TypeError):
            continue
        if entry.get("msg") not in RENEWALS:
            continue
        if node in last:
            found.append((node, (at - last[node]).total_seconds()))
        last[node] = at
    return found


def summary(log: Path, grace_seconds: float) -> dict[str, Any]:
    """The renewal gaps of a run: how many, the worst, and how many passed the grace."""
    if not log.exists():
        return {}
    with log.open(encoding="utf-8", errors="replace") as lines:
        found = gaps(lines)
    late = [node for node, g in found if g > grace_seconds]
    return {
        "gap_s": dist([g for _, g in found]),  # n: the renewals seen after a node's first
        "grace_s": grace_seconds,
        "gaps_past_grace": len(late),
        "nodes_past_grace": len(set(late)),
    }
