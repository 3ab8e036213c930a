"""Fencing: an attempt commits checkpoints only while it is the job's current attempt.

Why: a node that went NotReady is invisible, not dead. After a kubelet crash or a partition its
trainer may keep training and saving while the operator's next attempt, started elsewhere,
writes the same checkpoint directory; `max_to_keep` on each side would delete the other's
steps, and a colliding step number would make the new attempt restore the old one's state.

Design (the operator is the authority):

* Before it creates the pods of attempt N, the operator writes the token `N` as the annotation
  `LEASE_FENCE_ANNOTATION` on the job's heartbeat Lease (`TPUJOB_HEARTBEAT_LEASE` in
  `TPUJOB_NAMESPACE`). The trainer never writes it.
* Before each save (periodic, final and the SIGTERM save) every worker reads the Lease and
  decides with `decide`: token == own attempt -> commit; token > own attempt -> fenced: this
  attempt must not save and stops with exit code FENCED; token missing, malformed, older than
  the attempt, or unreadable (API error, timeout) -> fail closed: skip this save, keep training,
  the next save asks again.
* A save is collective (orbax synchronises processes), so a worker that skips while the others
  save would deadlock them. The workers therefore agree first: each contributes its verdict to
  one small all-gather and the most restrictive verdict wins (FENCED > SKIP > COMMIT).
* The token counts the attempts of one job object: with it the operator writes that job's uid
  (`LEASE_FENCE_JOB_ANNOTATION`), and the trainer knows its own (`TPUJOB_JOB_UID`). A Lease that
  names another job is fenced whatever its token says: a job deleted and applied again under
  its name counts from attempt 1 again, and a trainer left over from the earlier job must not
  take that for its own attempt 1. (A Lease without the uid counts attempts alone.)
* Without a configured Lease (a run outside the operator) fencing is off.

The remaining window: the check is a read followed by a commit, not an atomic compare-and-swap.
A zombie that read its own token just before the operator advanced it still commits that one
save (orbax's async write and its rename of the temporary directory finish afterwards), and its
`max_to_keep` may delete one old step while doing so. Its next check fences it. The new attempt
restores before it saves, and its own saves carry step numbers it trains to itself; the window is
bounded by one read plus one save's duration.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tpujob_trainer.contract import LEASE_FENCE_ANNOTATION, LEASE_FENCE_JOB_ANNOTATION, ExitCode
from tpujob_trainer.failures import TrainerError

log = logging.getLogger(__name__)

# Bounds what a token may be, so a garbled annotation is never read as a huge attempt.
MAX_TOKEN = 1_000_000


class Verdict(enum.IntEnum):
    """A fencing decision; the order is the agreement's: the largest verdict of any worker wins."""

    COMMIT = 0
    SKIP = 1
    FENCED = 2


class Reason(enum.StrEnum):
    """Why a verdict was reached."""

    CURRENT = "current"
    NEWER_ATTEMPT = "newer-attempt"
    MISSING = "missing"
    MALFORMED = "malformed"
    OLDER_TOKEN = "older-token"
    UNREADABLE = "unreadable"
    OTHER_JOB = "other-job"  # the Lease counts the attempts of another job of the same name


@dataclass(frozen=True)
class Decision:
    """One worker's (or the job's agreed) fencing decision and the token it saw."""

    verdict: Verdict
    reason: Reason
    token: int | None = None


class LeaseReader(Protocol):
    """The one read fencing needs: the annotations of a namespaced Lease."""

    def read_lease_annotations(self, name: str, namespace: str) -> Mapping[str, str]:
        """The Lease's metadata.annotations ({} when it has none); raises on API errors."""


class FencedError(TrainerError):
    """This attempt is fenced: a newer attempt owns the checkpoints."""

    def __init__(self, attempt: int, decision: Decision) -> None:
        owner, note = (
            ("another job of the same name", LEASE_FENCE_JOB_ANNOTATION)
            if decision.reason is Reason.OTHER_JOB
            else (f"attempt {decision.token}", LEASE_FENCE_ANNOTATION)
        )
        super().__init__(
            ExitCode.FENCED,
            f"attempt {attempt} is fenced: {owner} owns the checkpoints now (lease annotation "
            f"{note}); this attempt stopped without saving",
        )
        self.decision = decision


def parse_token(value: str | None) -> int | None:
    """The token as a non-negative attempt number, or None when it is not one."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > len(str(MAX_TOKEN)):
        return None
    token = int(text)
    return token if token <= MAX_TOKEN else None


def decide(
    annotations: Mapping[str, str] | None, attempt: int, job_uid: str | None = None
) -> Decision:
    """Pure: the verdict for `attempt` of job `job_uid` given the Lease's annotations (None:
    unreadable). Without a uid on either side the attempt alone decides."""
    if annotations is None:
        return Decision(Verdict.SKIP, Reason.UNREADABLE)
    owner = annotations.get(LEASE_FENCE_JOB_ANNOTATION)
    if job_uid and owner and owner != job_uid:
        return Decision(Verdict.FENCED, Reason.OTHER_JOB)
    raw = annotations.get(LEASE_FENCE_ANNOTATION)
    if raw is None:
        return Decision(Verdict.SKIP, Reason.MISSING)
    token = parse_token(raw)
    if token is None:
        return Decision(Verdict.SKIP, Reason.MALFORMED)
    if token == attempt:
        return Decision(Verdict.COMMIT, Reason.CURRENT, token)
    if token > attempt:
        return Decision(Verdict.FENCED, Reason.NEWER_ATTEMPT, token)
    # The operator writes the token before it creates the attempt's pods, so an older token
    # means the Lease was reset or written by someone else: not evidence of ownership.
    return Decision(Verdict.SKIP, Reason.OLDER_TOKEN, token)


def agree(decisions: Sequence[Sequence[int]]) -> Decision:
    """Pure: the job's decision from every worker's `(verdict, reason index, token)` row."""
    reasons = list(Reason)
    worst = max(decisions, key=lambda row: (row[0], row[2]))
    token = worst[2] if worst[2] >= 0 else None
    return Decision(Verdict(worst[0]), reasons[worst[1]], token)


# Gathers one row of ints from every process (in process order); identity for one process.
Gather = Callable[[Sequence[int]], Sequence[Sequence[int]]]


def _alone(row: Sequence[int]) -> Sequence[Sequence[int]]:
    return [row]


class SaveGate:
    """Asks the Lease, agrees with the other workers, and says whether this save may commit."""

    def __init__(
        self,
        reader: LeaseReader,
        *,
        lease: str,
        namespace: str,
        attempt: int,
        gather: Gather = _alone,
        job_uid: str | None = None,
    ) -> None:
        self._reader = reader
        self._lease = lease
        self._namespace = namespace
        self._attempt = attempt
        self._job_uid = job_uid
        self._gather = gather
        self.skipped = 0

    def check(self) -> Decision:
        """This worker's own decision; every error of the read fails closed."""
        try:
            annotations: Mapping[str, str] | None = self._reader.read_lease_annotations(
                self._lease, self._namespace
            )
        except Exception as error:
            log.warning(
                "fencing: reading lease %s/%s failed: %s",
                self._namespace,
                self._lease,
                str(error).splitlines()[0][:300] if str(error) else type(error).__name__,
            )
            annotations = None
        return decide(annotations, self._attempt, self._job_uid)

    def authorize(self, step: int) -> bool:
        """True: commit `step`. False: skip it (fail closed). Raises FencedError when fenced.

        Every process must call this at the same step: it is a collective.
        """
        mine = self.check()
        rows = self._gather(
            [
                int(mine.verdict),
                list(Reason).index(mine.reason),
                -1 if mine.token is None else mine.token,
            ]
        )
        job = agree(rows)
        if job.verdict is Verdict.FENCED:
            raise FencedError(self._attempt, job)
        if job.verdict is Verdict.SKIP:
            self.skipped += 1
            log.warning(
                "fencing: not saving step %d (%s, token %s, attempt %d); the next save asks again",
                step,
                job.reason,
                job.token,
                self._attempt,
            )
            return False
        return True
