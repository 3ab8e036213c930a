"""What a goodput run saw of each fault from outside: the controllers' writes to the arm's pods
(a watch) and the trainers' log lines (the local node agent's container logs).

`PodWrites.reaction_after(t)` is the first write a controller made to the arm's pods after `t`:
a pod created, a pod marked for deletion, or an order written on it (tpujob's rejoin order,
the in-place restart attempt JobSet's agent writes on its own pod: an annotation). A
fault's own effects (a container's end, a node's loss) are status changes, not counted.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as bench/*.py run it

from kubernetes import client, watch
from lost_seconds import Line, parse


class PodWrites:
    """The times of the controllers' writes to a namespace's pods, from its watch events."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._seen: dict[str, tuple[bool, str | None]] = {}

    def note(self, kind: str, uid: str, deleting: bool, order: str | None, at: float) -> None:
        """One watch event of pod `uid` at `at`: `deleting` when it is marked for deletion,
        `order` its order annotations (one string)."""
        before = self._seen.pop(uid, None)
        if kind == "DELETED":
            return
        self._seen[uid] = (deleting, order)
        # The watch starts on an empty namespace, so a pod first seen is a new one.
        marked = deleting and not (before is not None and before[0])
        ordered = before is not None and order != before[1]
        if before is None or marked or ordered:
            self.times.append(at)

    def reaction_after(self, t: float) -> float | None:
        return next((w for w in self.times if w > t), None)


class PodWatch:
    """A background watch of one namespace's pods feeding `PodWrites`; start it before the
    namespace has pods."""

    def __init__(
        self, core: client.CoreV1Api, namespace: str, *, annotations: tuple[str, ...]
    ) -> None:
        self._core = core
        self._namespace = namespace
        self._annotations = annotations
        self.writes = PodWrites()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self._core.list_namespaced_pod, self._namespace, timeout_seconds=30
                ):
                    meta = event["object"].metadata
                    found = meta.annotations or {}
                    orders = "\n".join(str(found.get(key)) for key in self._annotations)
                    self.writes.note(
                        event["type"],
                        meta.uid,
                        meta.deletion_timestamp is not None,
                        orders,
                        time.time(),
                    )
                    if self._stop.is_set():
                        stream.stop()
            except Exception:  # a broken watch is opened again
                time.sleep(0.5)

    def reaction_after(self, t: float) -> float | None:
        return self.writes.reaction_after(t)

    def close(self) -> None:
        self._stop.set()


def trainer_lines(state_dir: Path, namespace: str) -> list[Line]:
    """Every marked line of every container that ran for a pod of `namespace` on the local
    cluster (the node agent keeps each pod's folder, with one log per container start)."""
    lines: list[Line] = []
    for meta_file in (state_dir / "agent" / "pods").glob("*/meta.json"):
        try:
            meta: dict[str, Any] = json.loads(meta_file.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("namespace") != namespace:
            continue
        for log in sorted((meta_file.parent / "containers").glob("*/*.log")):
            lines += parse(log.read_text(errors="replace"))
    return lines
