"""Where the seconds of each fault go, read from the trainers' own log lines after a goodput run.

Every arm of `bench_goodput.py` runs the same trainer, so the same lines mark the same moments
in every arm, whoever restarts it (the operator, JobSet's controller, a supervisor in the pod):

* `joining job: process P of N` - a training process of the new world started (Python and JAX
  imported) and dials the coordinator;
* `restored step S from the T tier in Xs` - it holds the state of step S (the restore took X s);
  `resumed from step S` where no tier line is written;
* `step S/...` - a step done (the trainer is run with `--log-every 1`).

A fault's lost seconds run from the fault to the new world's first step, plus the steps done
again (the newest step any process reached before the fault, less the step restored) at the
run's own pace. They are cut at the world's milestones, each the last process's (a collective
step needs all of them): the controller's first reaction (from a watch of the pods, when there
is one), every process started, every restore begun, every restore done, the first step.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

# The trainer's log format: "%(asctime)s %(levelname)s %(name)s: %(message)s", local time.
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_STAMP_FORMAT = "%Y-%m-%d %H:%M:%S,%f"


class Mark(StrEnum):
    JOINED = "joined"
    RESTORED = "restored"
    STEP = "step"


# Ordered: the first pattern that matches a line names it.
_PATTERNS: tuple[tuple[Mark, re.Pattern[str]], ...] = (
    (Mark.JOINED, re.compile(r"joining job: process (?P<process>\d+) of \d+")),
    (Mark.RESTORED, re.compile(r"restored step (?P<step>\d+) from the \w+ tier in (?P<s>[\d.]+)s")),
    (Mark.RESTORED, re.compile(r"resumed from step (?P<step>\d+)")),
    (Mark.STEP, re.compile(r"\bstep (?P<step>\d+)/\d+ ")),
)


@dataclass(frozen=True)
class Line:
    """One marked line of one training process (`process` is JAX's process index)."""

    at: float
    process: int
    mark: Mark
    step: int | None = None
    seconds: float | None = None


def parse(text: str) -> list[Line]:
    """The marked lines of one container's log, each given the process of the `joining job`
    line before it (a supervisor's log holds every process it ran); lines before any join
    belong to no process and are dropped."""
    lines: list[Line] = []
    process: int | None = None
    for raw in text.splitlines():
        stamp = _STAMP.match(raw)
        if stamp is None:
            continue
        for mark, pattern in _PATTERNS:
            found = pattern.search(raw, stamp.end())
            if found is None:
                continue
            fields = found.groupdict()
            if mark is Mark.JOINED:
                process = int(fields["process"])
            if process is None:
                break
            at = datetime.strptime(stamp.group(1), _STAMP_FORMAT).timestamp()
            step = fields.get("step")
            seconds = fields.get("s")
            lines.append(
                Line(
                    at,
                    process,
                    mark,
                    int(step) if step is not None else None,
                    float(seconds) if seconds is not None else None,
                )
            )
            break
    return lines


def seconds_per_step(lines: Iterable[Line]) -> float | None:
    """The median time between one process's consecutive steps (process 0 of the run)."""
    steps = sorted((ln.at, ln.step) for ln in lines if ln.mark is Mark.STEP and ln.process == 0)
    gaps = [
        (b_at - a_at) / (b_step - a_step)
        for (a_at, a_step), (b_at, b_step) in itertools.pairwise(steps)
        if a_step is not None and b_step is not None and b_step > a_step
    ]
    return statistics.median(gaps) if gaps else None


@dataclass(frozen=True)
class Lost:
    """One fault's lost seconds, cut at the new world's milestones."""

    detect_s: float | None  # fault -> the controller's first reaction (None: not watched)
    restart_s: float  # -> every process started (pods replaced or not, imports done)
    start_up_s: float  # -> every restore begun (distributed start-up, the job's checks)
    restore_s: float  # -> every restore done
    first_step_s: float  # -> the first step (compile, from the cache if kept)
    redone_steps: int
    redone_s: float  # the steps done again, at the run's pace
    restored_step: int

    @property
    def lost_s(self) -> float:
        return round(
            (self.detect_s or 0.0)
            + self.restart_s
            + self.start_up_s
            + self.restore_s
            + self.first_step_s
            + self.redone_s,
            2,
        )

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "detect_s": self.detect_s,
            "restart_s": self.restart_s,
            "start_up_s": self.start_up_s,
            "restore_s": self.restore_s,
            "first_step_s": self.first_step_s,
            "redone_steps": self.redone_steps,
            "redone_s": self.redone_s,
            "restored_step": self.restored_step,
            "lost_s": self.lost_s,
        }


def breakdown(
    lines: Sequence[Line],
    fault_at: float,
    until: float,
    processes: int,
    pace: float,
    *,
    reaction_at: float | None = None,
) -> Lost | None:
    """The fault at `fault_at`, recovered before `until` (the next fault, or the run's end);
    None when not every one of `processes` restarted, restored and stepped again by then."""
    window = sorted((ln for ln in lines if fault_at < ln.at < until), key=lambda ln: ln.at)
    joined: dict[int, float] = {}
    begun: dict[int, float] = {}
    restored: dict[int, Line] = {}
    for ln in window:
        if ln.mark is Mark.JOINED:
            # A process that started again before the world formed: its last start counts.
            joined[ln.process] = ln.at
            restored.pop(ln.process, None)
        elif ln.mark is Mark.RESTORED and ln.process in joined:
            restored[ln.process] = ln
            begun[ln.process] = ln.at - (ln.seconds or 0.0)
    if len(joined) < processes or len(restored) < processes:
        return None
    all_restored = max(ln.at for ln in restored.values())
    first = next((ln for ln in window if ln.mark is Mark.STEP and ln.at >= all_restored), None)
    if first is None:
        return None
    restored_step = min(ln.step or 0 for ln in restored.values())
    before = [ln.step or 0 for ln in lines if ln.mark is Mark.STEP and ln.at <= fault_at]
    redone = max(0, max(before, default=restored_step) - restored_step)
    # Milestones in order, each no earlier than the one before.
    started = max(joined.values())
    react = None if reaction_at is None else min(max(reaction_at, fault_at), started)
    begin = max(*begun.values(), started)
    done = max(all_restored, begin)
    stepped = max(first.at, done)
    return Lost(
        detect_s=None if react is None else round(react - fault_at, 2),
        restart_s=round(started - (react if react is not None else fault_at), 2),
        start_up_s=round(begin - started, 2),
        restore_s=round(done - begin, 2),
        first_step_s=round(stepped - done, 2),
        redone_steps=redone,
        redone_s=round(redone * pace, 2),
        restored_step=restored_step,
    )
