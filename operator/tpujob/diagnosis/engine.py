"""Diagnosis of one worker: tries the layers in a fixed order and returns the first verdict.

Precedence, from strongest to weakest: user rules, node and pod facts, the trainer's
structured code, regexes on the message and log, exit reason and signal, the trainer's exit
code, the last raised exception and what it wraps, the learned text model, and the named
default (see `unknown.py` for what an unmatched failure gets and why).
Node facts outrank container text because a worker on a dying node prints whatever its
last collective saw; the trainer's own code outranks regexes because it was decided where
the exception was caught. Pure: no I/O besides the cached rule table.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from tpujob.api import contract
from tpujob.diagnosis import facts as f
from tpujob.diagnosis.exceptions import grade_exception
from tpujob.diagnosis.linear import compile_linear
from tpujob.diagnosis.model import (
    DEFAULT_ACTIONS,
    ChainLink,
    Confidence,
    Diagnosis,
    Evidence,
    FailureClass,
    FailureCode,
    Source,
)
from tpujob.diagnosis.rules import (
    Haystack,
    NodeSignal,
    Pattern,
    RuleTable,
    UserRule,
    Verdict,
    default_rule_table,
    first_line_match,
    matched_line,
    user_pattern,
)
from tpujob.diagnosis.textmodel import TextModel, model_input, packaged_model
from tpujob.diagnosis.unknown import MODEL_FLOOR, model_verdict

SIGNAL_NAMES = {
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    11: "SIGSEGV",
    15: "SIGTERM",
}
_VOLATILE = compile_linear(r"0x[0-9a-f]+|\d+|/[^\s:'\"]+|\s+", where="built-in volatile pattern")
# Only the end of a log matters; bounding it keeps the cost of a diagnosis flat.
MAX_LOG_CHARS = 64_000
_SIGNAL_SOURCES = {
    NodeSignal.DISRUPTION_TAINT_MANAGER: Source.POD,
    NodeSignal.DISRUPTION_PREEMPTION: Source.POD,
    NodeSignal.DISRUPTION_EVICTION: Source.POD,
    NodeSignal.DISRUPTION_KUBELET: Source.POD,
    NodeSignal.KILLED_BY_SIGNAL: Source.EXIT,
    NodeSignal.PENDING: Source.SCHEDULER,
    NodeSignal.HEARTBEAT_STALLED: Source.HEARTBEAT,
}


@dataclass(frozen=True)
class _Texts:
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


def _texts(worker: f.WorkerFacts, table: RuleTable) -> _Texts:
    # The trainer's JSON can spell a lone surrogate as an escape: its fields pass the gate too.
    trainer = f.encodable_facts(contract.parse_termination_message(worker.message))
    message = f"{trainer.summary}\n{trainer.traceback}" if trainer else worker.message
    return _Texts(message, worker.log_tail, worker.context, trainer, table)


def node_signals(worker: f.WorkerFacts) -> dict[NodeSignal, str]:
    """The node/pod/scheduler/heartbeat conditions present, each with its evidence text."""
    found: dict[NodeSignal, str] = {}
    node = worker.node
    if node is not None:
        if not node.exists:
            found[NodeSignal.NODE_GONE] = f"node {node.name} no longer exists"
        if node.accelerator_unhealthy:
            found[NodeSignal.ACCELERATOR_UNHEALTHY] = f"node {node.name} reports TPU unhealthy"
        if (
            node.tpu_allocatable is not None
            and node.tpu_requested is not None
            and node.tpu_allocatable < node.tpu_requested
        ):
            found[NodeSignal.TPU_ALLOCATABLE_DROPPED] = (
                f"node {node.name} allocatable google.com/tpu={node.tpu_allocatable}"
                f" < requested {node.tpu_requested}"
            )
        if f.TAINT_OUT_OF_SERVICE in node.taints:
            found[NodeSignal.NODE_OUT_OF_SERVICE] = (
                f"node {node.name} tainted {f.TAINT_OUT_OF_SERVICE}"
            )
        maintenance = [t for t in node.taints if t in f.MAINTENANCE_TAINTS] + [
            f"{key}={value}" for key, value in f.MAINTENANCE_LABELS if node.labels.get(key) == value
        ]
        if maintenance:
            found[NodeSignal.MAINTENANCE] = f"node {node.name}: {', '.join(maintenance)}"
        if f.SCHEDULED_MAINTENANCE_LABEL in node.labels:
            found[NodeSignal.MAINTENANCE_SCHEDULED] = (
                f"{f.SCHEDULED_MAINTENANCE_LABEL}={node.labels[f.SCHEDULED_MAINTENANCE_LABEL]}"
            )
        if node.ready in ("False", "Unknown"):
            found[NodeSignal.NODE_NOT_READY] = f"node {node.name} Ready={node.ready}"
        lost_taints = [t for t in node.taints if t in (f.TAINT_UNREACHABLE, f.TAINT_NOT_READY)]
        if lost_taints:
            found[NodeSignal.NODE_UNREACHABLE] = (
                f"node {node.name} tainted {', '.join(lost_taints)}"
            )
    disruption = {
        f.DISRUPTION_TAINT_MANAGER: NodeSignal.DISRUPTION_TAINT_MANAGER,
        f.DISRUPTION_PREEMPTION: NodeSignal.DISRUPTION_PREEMPTION,
        f.DISRUPTION_EVICTION_API: NodeSignal.DISRUPTION_EVICTION,
        f.DISRUPTION_KUBELET: NodeSignal.DISRUPTION_KUBELET,
    }.get(worker.disruption or "")
    if disruption is not None:
        found[disruption] = f"DisruptionTarget reason {worker.disruption}"
    if worker.effective_signal in (9, 15) and worker.reason != f.REASON_OOM_KILLED:
        found[NodeSignal.KILLED_BY_SIGNAL] = _exit_text(worker)
    if worker.pending is not None:
        found[NodeSignal.PENDING] = f"pending: {worker.pending.message}"
    if worker.heartbeat is not None and worker.heartbeat.stalled:
        found[NodeSignal.HEARTBEAT_STALLED] = (
            f"no heartbeat for {worker.heartbeat.seconds_since:.0f}s"
            f" (stall timeout {worker.heartbeat.stall_timeout:.0f}s)"
        )
    return found


def _exit_text(worker: f.WorkerFacts) -> str:
    parts = []
    if worker.exit_code is not None:
        parts.append(f"exit code {worker.exit_code}")
    signal = worker.effective_signal
    if signal is not None:
        parts.append(SIGNAL_NAMES.get(signal, f"signal {signal}"))
    if worker.reason:
        parts.append(f"reason {worker.reason}")
    return ", ".join(parts) or "no exit status"


@dataclass(frozen=True)
class _Hit:
    """The first layer's match: which rule, its verdict, and what it saw."""

    rule: str
    verdict: Verdict
    evidence: tuple[Evidence, ...]
    from_node: bool = False
    probability: float | None = None


def _user_hit(rules: Sequence[UserRule], worker: f.WorkerFacts, texts: _Texts) -> _Hit | None:
    for rule in rules:
        if not (rule.exit_codes or rule.reasons or rule.message_regex):
            continue
        if rule.exit_codes and worker.exit_code not in rule.exit_codes:
            continue
        if rule.reasons and worker.reason not in rule.reasons:
            continue
        detail = _exit_text(worker)
        if rule.message_regex:
            evidence = texts.search([user_pattern(rule.message_regex, rule.name)])
            if evidence is None:
                continue
            detail = evidence.detail
        verdict = Verdict(
            failure_class=rule.failure_class,
            code=rule.code or FailureCode.UNKNOWN,
            confidence=Confidence.HIGH,
            summary=f"matched the job's recovery rule {rule.name}",
        )
        return _Hit(rule.name, verdict, (Evidence(Source.USER_RULE, f"{rule.name}: {detail}"),))
    return None


def _node_hit(table: RuleTable, worker: f.WorkerFacts) -> _Hit | None:
    signals = node_signals(worker)
    for rule in table.node_rules:
        if rule.signals <= signals.keys():
            evidence = tuple(
                Evidence(_SIGNAL_SOURCES.get(s, Source.NODE), signals[s])
                for s in sorted(rule.signals)
            )
            return _Hit(rule.name, rule.verdict, evidence, from_node=True)
    return None


PEER_LOST_TRAINER_CODES = frozenset({FailureCode.COLLECTIVE_FAILURE})
# A trainer's own failure (a save, a restore) that broke because a peer went away mid-call:
# it reports the operation, but the words say the cause is elsewhere.
_PEER_GONE = compile_linear(
    r"connection (reset|closed) by peer|peer closed|gloo \w+ failed|another task died"
    r"|task \d+ (died|is no longer)|broken pipe",
    where="built-in peer-gone pattern",
)


def _trainer_hit(message: contract.TerminationMessage | None) -> _Hit | None:
    if message is None:
        return None
    try:
        code = FailureCode(message.code)
    except ValueError:
        code = FailureCode.UNKNOWN
    if code is FailureCode.UNKNOWN:
        return None  # the trainer did not know either: let the text decide
    verdict = Verdict(
        failure_class=FailureClass(str(message.class_hint)),
        code=code,
        confidence=Confidence.HIGH,
        summary=message.summary.splitlines()[0][:200] if message.summary else str(code),
        # The trainer reports a broken collective as its own failure; it means a peer left.
        consequence=code in PEER_LOST_TRAINER_CODES
        or _PEER_GONE.search(f"{message.summary}\n{message.traceback}") is not None,
    )
    detail = f"termination message code {message.code} ({message.class_hint})"
    return _Hit("trainer-code", verdict, (Evidence(Source.TRAINER, detail),))


def _text_hit(table: RuleTable, texts: _Texts) -> _Hit | None:
    for rule in table.text_rules:
        hit = texts.search(rule.any) if rule.any else None
        if rule.any and hit is None:
            continue
        also_hit = texts.search(rule.also) if rule.also else None
        if rule.also and also_hit is None:
            continue
        context_hit = texts.search_context(rule.context) if rule.context else None
        if rule.context and context_hit is None:
            continue
        if rule.unless and (texts.search(rule.unless) or texts.search_context(rule.unless)):
            continue
        evidence = tuple(e for e in (hit, also_hit, context_hit) if e is not None)
        return _Hit(rule.name, rule.verdict, evidence)
    return None


def _exit_hit(table: RuleTable, worker: f.WorkerFacts) -> _Hit | None:
    signal = worker.effective_signal
    evidence = (Evidence(Source.EXIT, _exit_text(worker)),)
    for rule in table.exit_rules:
        if (
            (worker.reason is not None and worker.reason in rule.reasons)
            or (signal is not None and signal in rule.signals)
            or (worker.exit_code is not None and worker.exit_code in rule.exit_codes)
        ):
            return _Hit(rule.name, rule.verdict, evidence)
    info = contract.describe_exit_code(worker.exit_code) if worker.exit_code else None
    if info is not None and info.code != FailureCode.UNKNOWN:
        verdict = Verdict(
            FailureClass(str(info.hint)), FailureCode(info.code), Confidence.MEDIUM, info.summary
        )
        return _Hit("trainer-exit-code", verdict, evidence)
    return None


def _exception_hit(texts: _Texts) -> _Hit | None:
    for source, text in ((Source.MESSAGE, texts.message), (Source.LOG, texts.log)):
        graded = grade_exception(text) if text else None
        if graded is not None:
            return _Hit(graded.rule, graded.verdict, (Evidence(source, graded.detail),))
    return None


def _model_hit(model: TextModel | None, texts: _Texts) -> _Hit | None:
    if model is None:
        return None
    prediction = model.predict(model_input(texts.context, texts.message, texts.log))
    if prediction.probability < MODEL_FLOOR:
        return None
    detail = f"text model: {prediction.failure_class} with probability {prediction.probability:.2f}"
    return _Hit(
        "text-model",
        model_verdict(prediction),
        (Evidence(Source.MODEL, detail),),
        probability=prediction.probability,
    )


def _default_hit(table: RuleTable, worker: f.WorkerFacts) -> _Hit:
    return _Hit(table.default_name, table.default, (Evidence(Source.DEFAULT, _exit_text(worker)),))


def _first_hit(
    worker: f.WorkerFacts,
    table: RuleTable,
    user_rules: Sequence[UserRule],
    texts: _Texts,
    model: TextModel | None,
) -> _Hit:
    """The layers in precedence order; the named default answers when none does."""
    return (
        _user_hit(user_rules, worker, texts)
        or _node_hit(table, worker)
        or _trainer_hit(texts.trainer)
        or _text_hit(table, texts)
        or _exit_hit(table, worker)
        or _exception_hit(texts)
        or _model_hit(model, texts)
        or _default_hit(table, worker)
    )


def signature_of(code: FailureCode, rule: str, evidence: Sequence[Evidence]) -> str:
    """A short stable id of "the same failure": code, rule and the matched text sans numbers."""
    detail = evidence[0].detail if evidence else ""
    normalized = _VOLATILE.sub(" ", detail).strip().lower()
    digest = hashlib.sha256(f"{code}|{rule}|{normalized}".encode()).hexdigest()[:12]
    return f"{code}:{digest}"


def worker_label(worker: f.WorkerFacts) -> str:
    if worker.worker_index is not None:
        return f"worker {worker.worker_index}"
    return f"pod {worker.pod_name}" if worker.pod_name else "the worker"


def diagnose_worker(
    worker: f.WorkerFacts,
    *,
    user_rules: Sequence[UserRule] = (),
    table: RuleTable | None = None,
    model: TextModel | Literal["packaged"] | None = "packaged",
) -> Diagnosis:
    """Diagnose one failed (or stuck) worker from its facts alone.

    `model` is the learned fallback: the packaged one by default, another (a fold's, in
    cross-validation) or None for rules only.
    """
    worker = admitted(worker)
    rule_table = table if table is not None else default_rule_table()
    text_model = packaged_model() if model == "packaged" else model
    texts = _texts(worker, rule_table)
    hit = _first_hit(worker, rule_table, user_rules, texts, text_model)
    rule, verdict, evidence = hit.rule, hit.verdict, hit.evidence
    chain: list[ChainLink] = []
    if hit.from_node:
        chain.append(ChainLink(evidence[0].detail, code=verdict.code))
        if worker.exit_code is not None:
            chain.append(ChainLink(f"died ({_exit_text(worker)})", worker.worker_index))
        elif worker.node is not None:
            chain.append(ChainLink("was lost with its node", worker.worker_index))
    else:
        chain.append(ChainLink(verdict.summary, worker.worker_index, verdict.code))
    step = worker.step
    if step is None and texts.trainer is not None:
        step = texts.trainer.step
    return Diagnosis(
        failure_class=verdict.failure_class,
        code=verdict.code,
        summary=verdict.summary,
        confidence=verdict.confidence,
        rule=rule,
        chain=tuple(chain),
        evidence=evidence,
        action=verdict.action or DEFAULT_ACTIONS[verdict.failure_class],
        advice=verdict.advice,
        signature=signature_of(verdict.code, rule, evidence),
        root_worker=worker.worker_index,
        consequence=verdict.consequence,
        step=step,
        probability=hit.probability,
    )
