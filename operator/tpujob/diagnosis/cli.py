"""`tpujob diagnose`: diagnose one failure from a log, or score the engine on a corpus.

    tpujob diagnose [--log FILE|-] [--exit-code N] [--reason R] [--context TEXT] [--json]
                    [--explain] [--site-rules FILE.yaml]
    tpujob diagnose --eval FILE.jsonl [--min-confidence low|medium|high] [--cv [--folds K]
                    [--unknown-policies]]

One failure is graded as the operator grades it: a text-model guess too weak to act on is
restarted once, not failed (`tpujob.diagnosis.unknown.weigh_model_guess`), and the output says
so. At least one fact of the failure is needed (a log, an exit code, a reason or a message);
errors and usage go to stderr, with exit status 2.

The eval ends with one machine-readable line,
`accuracy=A n=N fatal_retried=F retryable_failed=R`, and exits 0: the bar is enforced by
the unit tests, not by this command. `--cv` scores by grouped cross-validation (folds are
source repositories; the text model is refit without the fold it scores; needs numpy).
A log is read from its last `MAX_LOG_BYTES` only, so a huge log costs a bounded time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.table import Table

from tpujob.diagnosis.engine import diagnose_worker
from tpujob.diagnosis.evaluate import (
    CLASSES,
    DEFAULT_FOLDS,
    CorpusEntry,
    CorpusError,
    Fitter,
    Report,
    cross_validate,
    evaluate,
    parse_corpus,
)
from tpujob.diagnosis.explain import explain_worker
from tpujob.diagnosis.facts import WorkerFacts
from tpujob.diagnosis.model import Confidence, Diagnosis, FailureClass
from tpujob.diagnosis.site import SiteRule, SiteRulesError, parse_site_rules
from tpujob.diagnosis.texts import MAX_LOG_CHARS
from tpujob.diagnosis.unknown import CANDIDATES, CHOSEN, total_cost, weigh_model_guess


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="classify a failure as soft/medium/hard/fatal and explain why",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--log", metavar="FILE", help="log tail to read ('-' for stdin)")
    parser.add_argument("--exit-code", type=int, help="the container's exit code")
    parser.add_argument("--reason", help="the termination reason (OOMKilled, Error, ...)")
    parser.add_argument("--message", default="", help="the termination message (JSON or text)")
    parser.add_argument("--context", default="", help="other known facts, as free text")
    parser.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print which catalogue entry, rule, site rule or model features decided, and what"
        " came second",
    )
    parser.add_argument("--site-rules", metavar="FILE", help="a site rule set (YAML) to apply")
    parser.add_argument("--eval", metavar="FILE.jsonl", help="score the engine on a corpus")
    parser.add_argument(
        "--min-confidence",
        choices=[c.value for c in Confidence],
        default=Confidence.LOW.value,
        help="with --eval: skip corpus entries whose label is less certain",
    )
    parser.add_argument(
        "--cv", action="store_true", help="with --eval: grouped cross-validation by repository"
    )
    parser.add_argument("--folds", type=int, default=DEFAULT_FOLDS, help="with --cv: folds")
    parser.add_argument(
        "--unknown-policies",
        action="store_true",
        help="with --cv: score every candidate policy for unknown failures, with its cost",
    )
    parser.set_defaults(handler=run)


# A log's tail is all the engine reads; reading more of a huge file would only cost time.
MAX_LOG_BYTES = 4 * MAX_LOG_CHARS


def read_tail(path: Path, limit: int = MAX_LOG_BYTES) -> str:
    """The last `limit` bytes of a file, decoded leniently (a cut character is replaced)."""
    with path.open("rb") as handle:
        handle.seek(0, 2)
        size = handle.tell()
        handle.seek(max(0, size - limit))
        return handle.read(limit).decode("utf-8", errors="replace")


USAGE = (
    "usage: tpujob diagnose --log FILE|- | --exit-code N | --reason R | --message TEXT"
    " [--context TEXT] [--json|--explain], or tpujob diagnose --eval FILE.jsonl"
)


def run(
    args: argparse.Namespace,
    out: TextIO | None = None,
    stdin: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    stream = out if out is not None else sys.stdout
    console = Console(file=stream, highlight=False, soft_wrap=True, emoji=False)

    def refuse(message: str) -> int:
        print(f"tpujob diagnose: {message}", file=err if err is not None else sys.stderr)
        return 2

    if args.eval:
        try:
            with Path(args.eval).open(encoding="utf-8") as corpus:
                entries = parse_corpus(corpus)
        except (OSError, CorpusError) as error:
            return refuse(str(error))
        floor = Confidence(args.min_confidence)
        if args.cv:
            from tpujob.diagnosis.training import fit

            if args.unknown_policies:
                print_policies(console, entries, fit, args.folds, floor)
                return 0
            report = cross_validate(entries, fit, folds=args.folds, min_confidence=floor)
        else:
            report = evaluate(entries, min_confidence=floor)
        print_report(console, report)
        return 0
    if args.log is None and args.exit_code is None and args.reason is None and not args.message:
        # With no fact of the failure the engine still answers (unknown, medium): a verdict
        # on nothing would read as one on the failure the person meant to give.
        return refuse(f"nothing to diagnose; {USAGE}")
    log = ""
    if args.log == "-":
        log = (stdin if stdin is not None else sys.stdin).read()[-MAX_LOG_BYTES:]
    elif args.log:
        try:
            log = read_tail(Path(args.log))
        except OSError as error:
            return refuse(str(error))
    facts = WorkerFacts(
        exit_code=args.exit_code,
        reason=args.reason,
        message=args.message,
        log_tail=log,
        context=args.context,
    )
    try:
        site_rules = read_site_rules(Path(args.site_rules)) if args.site_rules else ()
    except (OSError, yaml.YAMLError, SiteRulesError) as error:
        return refuse(str(error))
    # The engine's verdict as the operator acts on it, so "fail the job now" is said only
    # where the operator would fail the job.
    guessed = diagnose_worker(facts, site_rules=site_rules)
    diagnosis = weigh_model_guess(guessed)
    if args.explain:
        for line in explain_worker(facts, site_rules=site_rules).lines():
            console.print(line, markup=False)
        if diagnosis.failure_class is not guessed.failure_class:
            console.print(f"operator: {diagnosis.headline}", markup=False)
            console.print(f"action: {diagnosis.action}", markup=False)
        return 0
    if args.json:
        stream.write(json.dumps(diagnosis.as_dict(), indent=2) + "\n")
    else:
        print_diagnosis(console, diagnosis)
    return 0


def read_site_rules(path: Path) -> tuple[SiteRule, ...]:
    return parse_site_rules(yaml.safe_load(path.read_text(encoding="utf-8")))


def print_diagnosis(console: Console, diagnosis: Diagnosis) -> None:
    console.print(diagnosis.headline, markup=False)
    console.print(f"confidence: {diagnosis.confidence} (rule {diagnosis.rule})", markup=False)
    console.print("chain (root -> symptom):", markup=False)
    for link in diagnosis.chain:
        console.print(f"  - {link}", markup=False)
    console.print("evidence:", markup=False)
    for item in diagnosis.evidence:
        console.print(f"  - {item}", markup=False)
    console.print(f"action: {diagnosis.action}", markup=False)
    if diagnosis.advice:
        console.print(f"advice: {diagnosis.advice}", markup=False)


def print_policies(
    console: Console, entries: list[CorpusEntry], fit: Fitter, folds: int, floor: Confidence
) -> None:
    """Grouped cross-validation under each candidate policy for unknown failures."""
    table = Table(title="unknown policies (grouped cross-validation)")
    table.add_column("policy", no_wrap=True)
    for column in ("accuracy", "wrongly failed", "restarts wasted", "nodes reused", "cost"):
        table.add_column(column, no_wrap=True)
    hard, fatal = FailureClass.HARD, FailureClass.FATAL
    for policy in CANDIDATES:
        report = cross_validate(entries, fit, folds=folds, min_confidence=floor, unknown=policy)
        reused = sum(report.confusion[hard][c] for c in CLASSES if c not in (hard, fatal))
        table.add_row(
            policy.name + (" (chosen)" if policy == CHOSEN else ""),
            f"{report.accuracy:.3f}",
            str(report.retryable_failed),
            str(report.fatal_retried),
            str(reused),
            f"{total_cost(report.confusion):.1f}",
        )
    console.print(table)


def print_report(console: Console, report: Report) -> None:
    scores = Table(title="per class")
    for column in ("class", "precision", "recall", "support"):
        scores.add_column(column)
    for score in report.per_class:
        scores.add_row(
            str(score.failure_class),
            f"{score.precision:.2f}",
            f"{score.recall:.2f}",
            str(score.support),
        )
    console.print(scores)
    confusion = Table(title="confusion (rows: label, columns: diagnosis)")
    confusion.add_column("label")
    for cls in CLASSES:
        confusion.add_column(str(cls))
    for expected in CLASSES:
        confusion.add_row(str(expected), *(str(report.confusion[expected][p]) for p in CLASSES))
    console.print(confusion)
    for item in report.scored:
        if not item.correct:
            console.print(
                f"miss {item.entry.id}: label {item.entry.label}, diagnosed"
                f" {item.diagnosis.failure_class} by rule {item.diagnosis.rule}",
                markup=False,
            )
    console.print(report.summary_line, markup=False)
