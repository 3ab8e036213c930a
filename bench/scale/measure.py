"""Symmetric measurements: process CPU and peak memory from /proc, apiserver request counts.

CPU is utime+stime and peak memory VmHWM, so the Python operator and the Go controllers are
measured the same way. Request counts come from the apiserver's own metrics: all clients by verb
(`apiserver_request_total`) and each benchmarked controller by verb (its FlowSchemas).
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>.*)\})? (?P<value>\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
FLOW = re.compile(r"^bench-(?P<name>.+)-(?P<verb>[a-z]+)$")


@dataclass(frozen=True)
class Proc:
    cpu_seconds: float
    rss_mib: float
    peak_rss_mib: float


def proc(pid: int) -> Proc | None:
    """CPU seconds so far and memory of a live process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None

    def mib(key: str) -> float:
        return round(int(status.get(key, "0 kB").split()[0]) / 1024, 1)

    return Proc(round((int(fields[11]) + int(fields[12])) / TICK, 2), mib("VmRSS"), mib("VmHWM"))


def samples(text: str, name: str) -> Iterator[tuple[dict[str, str], float]]:
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        m = SAMPLE.match(line)
        if m and m["name"] == name:
            yield dict(LABEL.findall(m["labels"] or "")), float(m["value"])


@dataclass(frozen=True)
class Requests:
    """Request counters at one moment: all clients by verb, benchmarked controllers by verb."""

    by_verb: dict[str, float]
    by_controller: dict[str, dict[str, float]]

    @staticmethod
    def parse(text: str) -> Requests:
        by_verb: dict[str, float] = defaultdict(float)
        for labels, value in samples(text, "apiserver_request_total"):
            by_verb[labels.get("verb", "?")] += value
        by_controller: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for labels, value in samples(text, "apiserver_flowcontrol_dispatched_requests_total"):
            m = FLOW.match(labels.get("flow_schema", ""))
            if m:
                by_controller[m["name"]][m["verb"]] += value
        return Requests(dict(by_verb), {k: dict(v) for k, v in by_controller.items()})

    def minus(self, before: Requests) -> dict[str, dict[str, int]]:
        """Deltas: `all` by verb, then each controller by verb, each with a `total`."""
        out = {"all": _delta(self.by_verb, before.by_verb)}
        for name, verbs in sorted(self.by_controller.items()):
            out[name] = _delta(verbs, before.by_controller.get(name, {}))
        return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, int]:
    d = {k: int(v - before.get(k, 0)) for k, v in sorted(after.items())}
    d = {k: v for k, v in d.items() if v}
    d["total"] = sum(d.values())
    return d
