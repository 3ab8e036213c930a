"""Failure diagnosis: facts about failed workers in, a classified and explained verdict out.

Pure code (no Kubernetes, no kopf); the operator builds the facts from pods and nodes and
acts on the returned `Diagnosis`. Import from here; the submodules are implementation.
"""

from tpujob.diagnosis.cascade import (
    DEFAULT_UNKNOWN_RETRY_LIMIT,
    apply_history,
    diagnose_job,
    pick_root,
)
from tpujob.diagnosis.engine import diagnose_worker
from tpujob.diagnosis.explain import Explanation, explain_worker
from tpujob.diagnosis.facts import HeartbeatFacts, JobFacts, NodeFacts, PendingFacts, WorkerFacts
from tpujob.diagnosis.history import PastFailure
from tpujob.diagnosis.model import (
    ChainLink,
    Confidence,
    Diagnosis,
    Evidence,
    FailureClass,
    FailureCode,
    Source,
    tag,
)
from tpujob.diagnosis.rules import (
    RuleTable,
    RuleTableError,
    UserRule,
    default_rule_table,
    parse_rule_table,
)
from tpujob.diagnosis.site import SiteRule, SiteRulesError, parse_site_rules

__all__ = [
    "DEFAULT_UNKNOWN_RETRY_LIMIT",
    "ChainLink",
    "Confidence",
    "Diagnosis",
    "Evidence",
    "Explanation",
    "FailureClass",
    "FailureCode",
    "HeartbeatFacts",
    "JobFacts",
    "NodeFacts",
    "PastFailure",
    "PendingFacts",
    "RuleTable",
    "RuleTableError",
    "SiteRule",
    "SiteRulesError",
    "Source",
    "UserRule",
    "WorkerFacts",
    "apply_history",
    "default_rule_table",
    "diagnose_job",
    "diagnose_worker",
    "explain_worker",
    "parse_rule_table",
    "parse_site_rules",
    "pick_root",
    "tag",
]
