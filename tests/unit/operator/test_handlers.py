"""The kopf wiring: every index the reconcile reads is registered under the name it is read by."""

from __future__ import annotations

import kopf
from tests.unit.operator.fakes import FakeReader, RecordingWriter

from tpujob import handlers
from tpujob.controller import Deps


def test_the_cache_is_attached_from_exactly_the_registered_indexes() -> None:
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    ids = [h.id for h in registry._indexing.get_all_handlers()]
    attach = next(h for h in registry._activities.get_all_handlers()
                  if h.id.endswith("attach_cache"))
    deps = Deps(reader=FakeReader([]), writer=RecordingWriter())  # type: ignore[arg-type]
    indexes = {name: {("team", name): ["value"]} for name in ids}
    attach.fn(memo=deps, **indexes)
    assert deps.view is not None
    assert {id(index) for index in vars(deps.view).values() if isinstance(index, dict)} == \
        {id(index) for index in indexes.values()}
