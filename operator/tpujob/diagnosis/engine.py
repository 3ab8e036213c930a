"""Diagnosis of one worker: tries the layers in a fixed order and returns the first verdict.

Precedence, from strongest to weakest (`Layer`): the job's own rules, the cluster's site
rules (`site.py`, a regrade of what the layers below found), node and pod facts, the
trainer's structured code, the rule table's regexes on the message and log, the
catalogues' regexes (`catalogue.py`), exit reason and signal, the trainer's exit code, the
last raised exception and the status it wraps (graded by the catalogues), the learned text
model, and the named default (see `unknown.py` for what an unmatched failure gets and why).
Node facts outrank container text because a worker on a dying node prints whatever its
last collective saw; the trainer's own code outranks regexes because it was decided where
the exception was caught. `ranked_hits` yields every layer's verdict lazily, so a
diagnosis pays for the first and `explain.py` can show what came second. Pure: no I/O
besides the cached rule table and catalogues.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from tpujob.api import contract
from tpujob.diagnosis import facts as f
from tpujob.diagnosis.catalogue import default_table
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
    NodeSignal,
    Pattern,
    RuleTable,
    TextRule,
    UserRule,
    Verdict,
    user_pattern,
)
from tpujob.diagnosis.signals import exit_text, node_signals
from tpujob.diagnosis.site import SiteFacts, SiteRule, first_match
from tpujob.diagnosis.textmodel import TextModel, model_input, packaged_model
from tpujob.diagnosis.texts import Texts, admitted, texts_of
from tpujob.diagnosis.unknown import CHOSEN, UnknownPolicy, model_verdict

_VOLATILE = compile_linear(r"0x[0-9a-f]+|\d+|/[^\s:'\"]+|\s+", where="built-in volatile pattern")
_SIGNAL_SOURCES = {
    NodeSignal.DISRUPTION_TAINT_MANAGER: Source.POD,
    NodeSignal.DISRUPTION_PREEMPTION: Source.POD,
    NodeSignal.DISRUPTION_EVICTION: Source.POD,
    NodeSignal.DISRUPTION_KUBELET: Source.POD,
    NodeSignal.KILLED_BY_SIGNAL: Source.EXIT,
    NodeSignal.PENDING: Source.SCHEDULER,
    NodeSignal.HEARTBEAT_STALLED: Source.HEARTBEAT,
}


class Layer(enum.StrEnum):
    """The layers of the engine, in precedence order."""

    USER = "job rule"
    SITE = "site rule"
    NODE = "node facts"
    TRAINER = "trainer code"
    RULES = "rule table"
    CATALOGUE = "catalogue"
    EXIT = "exit status"
    EXCEPTION = "exception catalogue"
    MODEL = "text model"
    DEFAULT = "default"


@dataclass(frozen=True)
class Hit:
    """One layer's match: which layer and rule, its verdict, and what it saw."""

    layer: Layer
    rule: str
    verdict: Verdict
    evidence: tuple[Evidence, ...]
    from_node: bool = False
    probability: float | None = None
    signature: str | None = None  # kept from the failure a site rule regraded


def _user_hit(rules: Sequence[UserRule], worker: f.WorkerFacts, texts: Texts) -> Hit | None:
    for rule in rules:
        if not (rule.exit_codes or rule.reasons or rule.message_regex):
            continue
        if rule.exit_codes and worker.exit_code not in rule.exit_codes:
            continue
        if rule.reasons and worker.reason not in rule.reasons:
            continue
        detail = exit_text(worker)
        if rule.message_regex:
            found = texts.search([user_pattern(rule.message_regex, rule.name)])
            if found is None:
                continue
            detail = found.detail
        verdict = Verdict(
            failure_class=rule.failure_class,
            code=rule.code or FailureCode.UNKNOWN,
            confidence=Confidence.HIGH,
            summary=f"matched the job's recovery rule {rule.name}",
        )
        evidence = (Evidence(Source.USER_RULE, f"{rule.name}: {detail}"),)
        return Hit(Layer.USER, rule.name, verdict, evidence)
    return None


def _node_hit(table: RuleTable, worker: f.WorkerFacts) -> Hit | None:
    signals = node_signals(worker)
    for rule in table.node_rules:
        if rule.signals <= signals.keys():
            evidence = tuple(
                Evidence(_SIGNAL_SOURCES.get(s, Source.NODE), signals[s])
                for s in sorted(rule.signals)
            )
            return Hit(Layer.NODE, rule.name, rule.verdict, evidence, from_node=True)
    return None


PEER_LOST_TRAINER_CODES = frozenset({FailureCode.COLLECTIVE_FAILURE})
# A trainer's own failure (a save, a restore) that broke because a peer went away mid-call:
# it reports the operation, but the words say the cause is elsewhere.
_PEER_GONE = compile_linear(
    r"connection (reset|closed) by peer|peer closed|gloo \w+ failed|another task died"
    r"|task \d+ (died|is no longer)|broken pipe",
    where="built-in peer-gone pattern",
)


def _trainer_hit(message: contract.TerminationMessage | None) -> Hit | None:
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
    return Hit(Layer.TRAINER, "trainer-code", verdict, (Evidence(Source.TRAINER, detail),))


def _text_hits(rules: Sequence[TextRule], texts: Texts, layer: Layer) -> Iterator[Hit]:
    """Every text rule that holds, in order (the engine takes the first; explain, two)."""
    for rule in rules:
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
        yield Hit(layer, rule.name, rule.verdict, evidence)


def _exit_hit(table: RuleTable, worker: f.WorkerFacts) -> Hit | None:
    signal = worker.effective_signal
    evidence = (Evidence(Source.EXIT, exit_text(worker)),)
    for rule in table.exit_rules:
        if (
            (worker.reason is not None and worker.reason in rule.reasons)
            or (signal is not None and signal in rule.signals)
            or (worker.exit_code is not None and worker.exit_code in rule.exit_codes)
        ):
            return Hit(Layer.EXIT, rule.name, rule.verdict, evidence)
    info = contract.describe_exit_code(worker.exit_code) if worker.exit_code else None
    if info is not None and info.code != FailureCode.UNKNOWN:
        verdict = Verdict(
            FailureClass(str(info.hint)), FailureCode(info.code), Confidence.MEDIUM, info.summary
        )
        return Hit(Layer.EXIT, "trainer-exit-code", verdict, evidence)
    return None


def _exception_hit(texts: Texts) -> Hit | None:
    for source, text in ((Source.MESSAGE, texts.message), (Source.LOG, texts.log)):
        graded = grade_exception(text) if text else None
        if graded is not None:
            evidence = (Evidence(source, graded.detail),)
            return Hit(Layer.EXCEPTION, graded.rule, graded.verdict, evidence)
    return None


def _model_hit(model: TextModel | None, texts: Texts, policy: UnknownPolicy) -> Hit | None:
    if model is None:
        return None
    prediction = model.predict(model_input(texts.context, texts.message, texts.log))
    if not policy.accepts(prediction):
        return None
    detail = f"text model: {prediction.failure_class} with probability {prediction.probability:.2f}"
    return Hit(
        Layer.MODEL,
        "text-model",
        model_verdict(prediction),
        (Evidence(Source.MODEL, detail),),
        probability=prediction.probability,
    )


def _default_hit(table: RuleTable, worker: f.WorkerFacts) -> Hit:
    evidence = (Evidence(Source.DEFAULT, exit_text(worker)),)
    return Hit(Layer.DEFAULT, table.default_name, table.default, evidence)


def _layers(
    worker: f.WorkerFacts,
    *,
    table: RuleTable,
    user_rules: Sequence[UserRule],
    texts: Texts,
    model: TextModel | None,
    unknown: UnknownPolicy,
) -> Iterator[Hit]:
    """The layers' hits in precedence order, each tried only when asked for."""
    if hit := _user_hit(user_rules, worker, texts):
        yield hit
    if hit := _node_hit(table, worker):
        yield hit
    if hit := _trainer_hit(texts.trainer):
        yield hit
    killed = _killed_from_outside(worker)
    for hit in _read_hits(worker, table=table, texts=texts, model=model, unknown=unknown):
        if not (
            killed and hit.layer in _TEXT_LAYERS and hit.verdict.failure_class is FailureClass.FATAL
        ):
            yield hit
    yield _default_hit(table, worker)


def _read_hits(
    worker: f.WorkerFacts,
    *,
    table: RuleTable,
    texts: Texts,
    model: TextModel | None,
    unknown: UnknownPolicy,
) -> Iterator[Hit]:
    """The hits of the layers below the trainer's code, in precedence order."""
    yield from _text_hits(table.text_rules, texts, Layer.RULES)
    yield from _text_hits(table.catalogue_rules, texts, Layer.CATALOGUE)
    if hit := _exit_hit(table, worker):
        yield hit
    if hit := _exception_hit(texts):
        yield hit
    if hit := _model_hit(model, texts, unknown):
        yield hit


# The layers that grade what a process printed, not how it ended.
_TEXT_LAYERS = frozenset({Layer.RULES, Layer.CATALOGUE, Layer.EXCEPTION, Layer.MODEL})


def _killed_from_outside(worker: f.WorkerFacts) -> bool:
    """Whether the process ended by SIGKILL or SIGTERM it did not send itself (no OOM kill).

    Such a process did not stop at the error its log shows: a user's deterministic error ends
    the program with an exit code of its own. So no text read from it can prove the failure
    the user's (fatal); it says what was happening when the kill came, and the kill is the
    failure. Text that blames the host or a peer still counts (a dying host's TPU errors
    come before its processes are killed).
    """
    return worker.effective_signal in (9, 15) and worker.reason != f.REASON_OOM_KILLED


def _site_hit(
    rules: Sequence[SiteRule], worker: f.WorkerFacts, texts: Texts, base: Hit
) -> Hit | None:
    """A site rule's regrade of the failure the other layers found (`site.py`)."""
    signature = signature_of(base.verdict.code, base.rule, base.evidence)
    facts = SiteFacts(signature, worker.exit_code, worker.reason)

    def search(pattern: Pattern) -> str | None:
        evidence = texts.search([pattern])
        return evidence.detail if evidence is not None else None

    found = first_match(rules, facts, search)
    if found is None:
        return None
    rule, detail = found
    cls = rule.failure_class
    verdict = replace(
        base.verdict,
        failure_class=cls,
        code=rule.code or base.verdict.code,
        confidence=Confidence.HIGH,
        summary=f"{base.verdict.summary} ({rule.note})",
        action=DEFAULT_ACTIONS[cls],
    )
    evidence = (Evidence(Source.SITE_RULE, f"{rule.note} [{detail}]"), *base.evidence)
    return Hit(Layer.SITE, f"site:{rule.name}", verdict, evidence, signature=signature)


def ranked_hits(
    worker: f.WorkerFacts,
    *,
    user_rules: Sequence[UserRule] = (),
    site_rules: Sequence[SiteRule] = (),
    table: RuleTable | None = None,
    model: TextModel | Literal["packaged"] | None = "packaged",
    unknown: UnknownPolicy = CHOSEN,
) -> Iterator[Hit]:
    """Every layer's verdict on the worker, strongest first, lazily: the first decides,
    the next is what came second. A site rule regrades the first hit unless the job's own
    rule decided."""
    worker = admitted(worker)
    rule_table = table if table is not None else default_table()
    text_model = packaged_model() if model == "packaged" else model
    texts = texts_of(worker, rule_table)
    layers = _layers(
        worker,
        table=rule_table,
        user_rules=user_rules,
        texts=texts,
        model=text_model,
        unknown=unknown,
    )
    first = next(layers)
    if site_rules and first.layer is not Layer.USER:
        site = _site_hit(site_rules, worker, texts, first)
        if site is not None:
            yield site
    yield first
    yield from layers


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
    site_rules: Sequence[SiteRule] = (),
    table: RuleTable | None = None,
    model: TextModel | Literal["packaged"] | None = "packaged",
    unknown: UnknownPolicy = CHOSEN,
) -> Diagnosis:
    """Diagnose one failed (or stuck) worker from its facts alone.

    `site_rules` are the cluster's regrades (`site.py`); `model` is the learned fallback:
    the packaged one by default, another (a fold's, in cross-validation) or None for rules
    only; `unknown` says when its guess is taken (`unknown.py`).
    """
    worker = admitted(worker)
    hits = ranked_hits(
        worker,
        user_rules=user_rules,
        site_rules=site_rules,
        table=table,
        model=model,
        unknown=unknown,
    )
    return diagnosis_of(worker, next(hits))


def diagnosis_of(worker: f.WorkerFacts, hit: Hit) -> Diagnosis:
    """The diagnosis a hit makes of the (admitted) worker."""
    rule, verdict, evidence = hit.rule, hit.verdict, hit.evidence
    chain: list[ChainLink] = []
    if hit.from_node:
        chain.append(ChainLink(evidence[0].detail, code=verdict.code))
        if worker.exit_code is not None:
            chain.append(ChainLink(f"died ({exit_text(worker)})", worker.worker_index))
        elif worker.node is not None:
            chain.append(ChainLink("was lost with its node", worker.worker_index))
    else:
        chain.append(ChainLink(verdict.summary, worker.worker_index, verdict.code))
    step = worker.step
    trainer = contract.parse_termination_message(worker.message)
    if step is None and trainer is not None:
        step = trainer.step
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
        signature=hit.signature or signature_of(verdict.code, rule, evidence),
        root_worker=worker.worker_index,
        consequence=verdict.consequence,
        step=step,
        probability=hit.probability,
    )
