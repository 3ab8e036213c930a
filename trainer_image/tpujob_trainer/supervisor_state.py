"""The supervisor's state file: what a supervisor restarted in its pod learns of the one before.

A supervised trainer container killed whole (exit 137: a SIGKILL from outside, or an OOM kill
that took the supervisor with its child) is restarted in its pod by the kubelet's container
restart rule (`contract.CONTAINER_RESTART_EXIT_CODES`). The new supervisor would otherwise start
over as the pod's first attempt, with nothing said about the kill. So the supervisor writes, in
the pod's scratch emptyDir (`contract.ENV_SUPERVISOR_STATE`), which outlives its container, the
attempt it runs and, as it ends on purpose, the code it ends with. On start it reads:

* no file: the container's first start;
* an attempt and no end: the container was killed while it ran that attempt;
* an end: it ended on purpose and was started again anyway; with a restarted code (it passed
  on a child's SIGKILL) it must not loop, so it ends at once with `ExitCode.ENDED_AFTER_KILL`.

Standard library only, like the supervisor. A file that cannot be read or written counts as
none: the container then behaves as before the file existed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MAX_STATE_BYTES = 256


@dataclass(frozen=True)
class SupervisorState:
    """The attempt a supervisor runs; `ended`: the code it ended with on purpose, if it did."""

    attempt: int
    ended: int | None = None


def parse_state(text: str) -> SupervisorState | None:
    """The state in `text`; None for anything else."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    attempt, ended = data.get("attempt"), data.get("ended")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 0:
        return None
    if ended is not None and (not isinstance(ended, int) or isinstance(ended, bool)):
        return None
    return SupervisorState(attempt, ended)


def encode_state(state: SupervisorState) -> str:
    return json.dumps({"attempt": state.attempt, "ended": state.ended}, separators=(",", ":"))


def read_state(path: Path | None) -> SupervisorState | None:
    if path is None:
        return None
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_STATE_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_STATE_BYTES:
        return None
    return parse_state(raw.decode(errors="replace"))


def write_state(path: Path | None, state: SupervisorState) -> None:
    """Replace the file with `state` at once (a rename), so a kill mid-write leaves the old."""
    if path is None:
        return
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(encode_state(state))
        os.replace(partial, path)
    except OSError as err:
        log.warning("could not keep the supervisor's state in %s (%s)", path, err)
        with contextlib.suppress(OSError):
            partial.unlink()
