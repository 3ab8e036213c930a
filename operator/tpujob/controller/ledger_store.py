"""Keeping the node ledger: loaded once at start-up, saved after each blame a plan adds.

The ledger is advice that outlives one job (`tpujob.plan.node_ledger`), so it lives in a ConfigMap
the operator owns in its own namespace. Losing it costs only memory: a ConfigMap that cannot
be read or parsed starts a new ledger, and a save that fails is logged and retried with the
next blame (the ledger in memory still holds it).
"""

from __future__ import annotations

import logging

from tpujob.controller.deps import Deps
from tpujob.diagnosis.memory import (
    Blame,
    LedgerFormatError,
    ledger_from_data,
    ledger_to_data,
    record_blame,
)
from tpujob.kube.errors import KubeError

LEDGER_CONFIGMAP = "tpujob-node-ledger"
log = logging.getLogger("tpujob.ledger")


async def load_ledger(deps: Deps) -> None:
    namespace = deps.ledger_namespace
    if namespace is None:
        return
    try:
        data = await deps.run(deps.reader.config_data, namespace, LEDGER_CONFIGMAP)
        deps.ledger = ledger_from_data(data)
    except (KubeError, LedgerFormatError) as err:
        log.warning(
            "node ledger %s/%s not read, starting a new one: %s", namespace, LEDGER_CONFIGMAP, err
        )


def ledger_rows(deps: Deps) -> tuple[tuple[str, str, float], ...]:
    return tuple((b.node, b.job, b.at) for b in deps.ledger.blames)


async def remember_blame(deps: Deps, blame: Blame) -> None:
    """Add `blame` and save the ledger; saves are serialised so none is overwritten by an
    older one."""
    deps.ledger, _ = record_blame(deps.ledger, blame, now=blame.at)
    namespace = deps.ledger_namespace
    if namespace is None:
        return
    async with deps.ledger_lock:
        try:
            await deps.run(
                deps.writer.save_config, namespace, LEDGER_CONFIGMAP, ledger_to_data(deps.ledger)
            )
        except KubeError as err:
            log.warning("node ledger not saved (kept in memory): %s", err)
