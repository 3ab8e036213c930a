"""A job's earlier failure, as both history readers see it: the repeat guards and the memory.

One record per failure in the job's status, oldest first. The cascade's guards
(`cascade.apply_history`) compare the diagnosis's own `signature` and step, which differ
whenever the message or the step does; the memory (`memory.judge`) compares the coarser
`memory_signature`, equal across attempts, nodes and steps. Records written before the
memory existed lack its fields: they still count for the guards, and the memory skips them.
The operator builds these from its status (`tpujob.plan.job_memory.past_failure`); nothing
here reads the status itself, so the diagnosis stays free of the API's status types.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpujob.diagnosis.model import FailureClass, FailureCode


@dataclass(frozen=True, kw_only=True)
class PastFailure:
    """One diagnosed failure of the job; the memory also passes the current one, last."""

    signature: str  # the diagnosis's signature: the repeat guard's key
    code: FailureCode | None  # None: a code this operator does not know
    step: int | None = None
    node: str = ""
    slice_index: int | None = None
    # The memory's fields; None in records written before the memory existed.
    attempt: int | None = None
    failure_class: FailureClass | None = None  # None also when the stored class is unknown
    memory_signature: str | None = None  # `memory.failure_signature`: code and root message
    progressed: bool = False  # the attempt reported training progress of its own
