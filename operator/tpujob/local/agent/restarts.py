"""Whether the kubelet restarts a container that ended: the pod's restartPolicy, a container's
own restartPolicy and its restartPolicyRules (KEP-5307, ContainerRestartRules).

Pure. As the kubelet decides it: the first rule whose exit codes match the end gives the action
(Restart, the one action the API accepts); with none matching, the container's restartPolicy
holds where it has one, else the pod's. Always restarts every end, OnFailure a non-zero one,
Never none. A rule of an operator or action the agent does not know matches nothing, as a field
the apiserver would have refused.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class RestartPolicy(enum.StrEnum):
    ALWAYS = "Always"
    ON_FAILURE = "OnFailure"
    NEVER = "Never"


class RuleOperator(enum.StrEnum):
    IN = "In"
    NOT_IN = "NotIn"


RESTART_ACTION = "Restart"


@dataclass(frozen=True)
class RestartRule:
    """One of a container's restartPolicyRules: restart when the exit code is (not) in `values`."""

    operator: RuleOperator
    values: frozenset[int]

    def matches(self, exit_code: int) -> bool:
        inside = exit_code in self.values
        return inside if self.operator is RuleOperator.IN else not inside


@dataclass(frozen=True)
class ContainerRestarts:
    """What decides a container's restarts: its own policy (None: the pod's) and rules."""

    policy: RestartPolicy | None = None
    rules: tuple[RestartRule, ...] = ()


def _policy(value: Any) -> RestartPolicy | None:
    try:
        return RestartPolicy(str(value))
    except ValueError:
        return None


def container_restarts(container: Mapping[str, Any]) -> ContainerRestarts:
    """The restart fields of a container spec (raw, as the API serves it)."""
    rules: list[RestartRule] = []
    for raw in container.get("restartPolicyRules") or []:
        if not isinstance(raw, Mapping) or raw.get("action") != RESTART_ACTION:
            continue
        codes = raw.get("exitCodes")
        if not isinstance(codes, Mapping):
            continue
        try:
            operator = RuleOperator(str(codes.get("operator")))
            values = frozenset(int(v) for v in codes.get("values") or [])
        except (TypeError, ValueError):
            continue
        rules.append(RestartRule(operator, values))
    return ContainerRestarts(_policy(container.get("restartPolicy")), tuple(rules))


def restarts(pod_policy: str, container: ContainerRestarts, exit_code: int) -> bool:
    """Whether a container that ended with `exit_code` is started again in its pod."""
    if any(rule.matches(exit_code) for rule in container.rules):
        return True
    policy = container.policy or _policy(pod_policy) or RestartPolicy.ALWAYS
    if policy is RestartPolicy.ALWAYS:
        return True
    return policy is RestartPolicy.ON_FAILURE and exit_code != 0
