"""Every reason and timeline kind the operator writes comes from `tpujob.api.reasons`."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "tpujob"
# Arguments that name a reason or a kind, by the callee's name: their positions.
REASON_ARGUMENTS = {"condition": (0, 2), "timeline": (0,), "event": (0, 1), "EventSpec": (0, 1)}
REASON_ATTRIBUTES = {"reason", "kind", "type"}


def _literal(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def literal_reasons(tree: ast.AST) -> list[int]:
    """Lines where a reason, kind or Event type is written or compared as a bare string."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if ast.unparse(func).startswith("kopf."):  # kopf.on.event(group, version, ...)
                continue
            positions = REASON_ARGUMENTS.get(name, ())
            if any(i < len(node.args) and _literal(node.args[i]) for i in positions):
                lines.append(node.lineno)
            if name in {"Condition", "TimelineEvent"} and any(
                k.arg in REASON_ATTRIBUTES and _literal(k.value) for k in node.keywords
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(isinstance(s, ast.Attribute) and s.attr in REASON_ATTRIBUTES for s in sides)
            if named and any(_literal(s) for s in sides):
                lines.append(node.lineno)
    return lines


def test_the_check_finds_a_literal_reason() -> None:
    code = 'draft.condition(ConditionType.RUNNING, False, "WaitingForPool")\nx = c.reason == "Y"\n'
    assert literal_reasons(ast.parse(code)) == [1, 2]


def test_no_reason_is_written_as_a_literal_outside_the_reasons_module() -> None:
    found = {}
    for wing in ("observed", "plan", "controller", "kube"):
        for path in sorted((PACKAGE / wing).rglob("*.py")):
            lines = literal_reasons(ast.parse(path.read_text()))
            if lines:
                found[str(path.relative_to(PACKAGE))] = lines
    assert found == {}
