"""The operator's command-line flags refuse values that would break it later, naming them."""

from __future__ import annotations

import argparse

import pytest

from tpujob.controller.main import positive_seconds


@pytest.mark.parametrize(("text", "seconds"), [("60", 60.0), ("0.5", 0.5), ("1e3", 1000.0)])
def test_positive_seconds_are_taken(text: str, seconds: float) -> None:
    assert positive_seconds(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [("0", "above 0"), ("-5", "above 0"), ("nan", "above 0"), ("soon", "not a number")],
)
def test_zero_negative_or_no_seconds_are_refused_with_the_value(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message) as err:
        positive_seconds(text)
    assert text in str(err.value)
