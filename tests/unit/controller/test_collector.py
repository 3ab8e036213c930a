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
def test_tuning_takes_what_start_up_made_out_of_the_collectors_walks() -> None:
    made_at_start_up: list[list[int]] = [[n] for n in range(10)]
    assert any(o is made_at_start_up for o in gc.get_objects())
    collector.tune()
    assert gc.get_threshold() == (collector.YOUNG_THRESHOLD, *collector.OLDER_THRESHOLDS)
    # Frozen: in the permanent generation, which no collection walks.
    assert not any(o is made_at_start_up for o in gc.get_objects())
    made_after = [[0]]
    assert any(o is made_after for o in gc.get_objects())
