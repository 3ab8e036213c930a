"""The operator's garbage collector: start-up's objects frozen, young collections rarer."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from tpujob.controller import collector


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored")
def test_tuning_freezes_what_exists_and_raises_the_thresholds() -> None:
    made_at_start_up = [object() for _ in range(10)]
    collector.tune()
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *collector.OLDER_THRESHOLDS)
    assert gc.get_freeze_count() >= len(made_at_start_up)
