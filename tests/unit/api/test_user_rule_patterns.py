"""Admission refuses a user rule pattern the engine's RE2 could not run, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tpujob.api.recovery import UserRule


@pytest.mark.parametrize("pattern", ["(?<=a)b", "(a)\\1", "x(?!y)", "(unclosed"])
def test_pattern_re2_refuses_is_refused_naming_the_field(pattern: str) -> None:
    with pytest.raises(ValidationError, match=r"messagePattern does not compile as an RE2"):
        UserRule.model_validate({"class": "fatal", "messagePattern": pattern})


def test_catastrophic_backtracking_pattern_is_accepted_because_re2_runs_it_linearly() -> None:
    rule = UserRule.model_validate({"class": "fatal", "messagePattern": "(a|aa)+$"})
    assert rule.message_pattern == "(a|aa)+$"
