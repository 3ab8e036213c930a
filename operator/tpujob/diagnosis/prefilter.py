"""A cheap pre-check for regexes: literal strings of which every match must contain one.

Case-insensitive regexes get no literal-prefix speed-up in Python's `re`, so ~150 of them on
an 80-line log cost milliseconds. Before running a regex the engine checks, with a plain
substring search in the lower-cased text, that one of the pattern's required literals is
present; most rules are then skipped at C speed. The literals are derived from the
pattern's parse tree; whenever the derivation is unsure it returns None and the regex is
always run, so the pre-check can only skip work, never change a result.
"""

from __future__ import annotations

import importlib
from typing import Any

# The parser is the one `re` itself uses; it has no type stubs, hence the dynamic import.
_parser: Any = importlib.import_module("re._parser")
_constants: Any = importlib.import_module("re._constants")

MIN_LITERAL = 3  # shorter literals select too little to be worth checking


def _best(candidates: list[frozenset[str]]) -> frozenset[str] | None:
    usable = [c for c in candidates if c and min(len(s) for s in c) >= MIN_LITERAL]
    return max(usable, key=lambda c: min(len(s) for s in c), default=None)


def _required(items: Any) -> frozenset[str] | None:
    candidates: list[frozenset[str]] = []
    run: list[str] = []

    def flush() -> None:
        if run:
            candidates.append(frozenset({"".join(run).lower()}))
            run.clear()

    for op, arg in items:
        if op is _constants.LITERAL and arg < 128:
            run.append(chr(arg))
            continue
        flush()
        if op is _constants.SUBPATTERN:
            sub = _required(arg[3])
        elif op is _constants.BRANCH:
            branches = [_required(alternative) for alternative in arg[1]]
            known = [b for b in branches if b is not None]
            sub = frozenset[str]().union(*known) if len(known) == len(branches) else None
        elif op in (_constants.MAX_REPEAT, _constants.MIN_REPEAT) and arg[0] >= 1:
            sub = _required(arg[2])
        else:
            sub = None
        if sub is not None:
            candidates.append(sub)
    flush()
    return _best(candidates)


def required_literals(pattern: str) -> frozenset[str] | None:
    """Lower-cased strings one of which every match of `pattern` contains; None if unknown."""
    try:
        return _required(_parser.parse(pattern))
    except Exception:  # any surprise in the private parser just disables the pre-check
        return None
