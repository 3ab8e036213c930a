"""The texts a worker's diagnosis reads: the gate for text from outside, and its haystacks.

A worker's message (or the trainer's structured summary and traceback), log tail and
context are cut to what the engine reads and made encodable once (`admitted`), then each
is made a haystack once for every rule that searches it. Pure.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from tpujob.api import contract
from tpujob.diagnosis import facts as f
from tpujob.diagnosis.model import Evidence, Source
from tpujob.diagnosis.rules import Haystack, Pattern, RuleTable, first_line_match, matched_line

# Only the end of a log matters; bounding it keeps the cost of a diagnosis flat.
MAX_LOG_CHARS = 64_000


@dataclass(frozen=True)
class Texts:
    """The searchable text of a worker, split by where it came from, each made a haystack once."""

    message: str
    log: str
    context: str
    trainer: contract.TerminationMessage | None
    table: RuleTable

    @functools.cached_property
    def _sources(self) -> tuple[tuple[Source, Haystack], ...]:
        return tuple(
            (source, self.table.haystack(text))
            for source, text in ((Source.MESSAGE, self.message), (Source.LOG, self.log))
            if text
        )

    @functools.cached_property
    def _context(self) -> Haystack:
        return self.table.haystack(self.context)

    def search(self, patterns: Sequence[Pattern]) -> Evidence | None:
        for source, haystack in self._sources:
            found = first_line_match(patterns, haystack)
            if found:
                return Evidence(source, matched_line(haystack.text, found))
        return None

    def search_context(self, patterns: Sequence[Pattern]) -> Evidence | None:
        if not self.context:
            return None
        found = first_line_match(patterns, self._context)
        return Evidence(Source.CONTEXT, matched_line(self.context, found)) if found else None


def admitted(worker: f.WorkerFacts) -> f.WorkerFacts:
    """The gate for text from outside: the log cut to the tail the engine reads, then every
    string made encodable (`facts.encodable`), so no rule, hash or status write meets a lone
    surrogate. Cutting first keeps the cost flat whatever the log's size; idempotent."""
    if len(worker.log_tail) > MAX_LOG_CHARS:
        worker = replace(worker, log_tail=worker.log_tail[-MAX_LOG_CHARS:])
    return f.encodable_facts(worker)


def texts_of(worker: f.WorkerFacts, table: RuleTable) -> Texts:
    # The trainer's JSON can spell a lone surrogate as an escape: its fields pass the gate too.
    trainer = f.encodable_facts(contract.parse_termination_message(worker.message))
    message = f"{trainer.summary}\n{trainer.traceback}" if trainer else worker.message
    return Texts(message, worker.log_tail, worker.context, trainer, table)
