"""How often Python's cyclic garbage collector runs in the operator, set once at start-up.

The operator allocates without pause: every watch event of every pod, node, Lease and job is
parsed into fresh dicts and lists, and every reconcile builds its view and plan anew. At the
collector's default thresholds (a young collection every 700 allocations, older ones every 10
of those) that is hundreds of collections a second in a burst, each walking objects that live
for the operator's whole run (its modules, settings, caches). In the 250-pool ladder
(`bench/bench_scale.py`) the collector took 3.5 s of the operator's 40.6 s of CPU, in 1,340
collections. Two standard remedies: what exists once start-up is done is frozen out of the
collector's walks (`gc.freeze`: the permanent generation), and the young generation is
collected every `YOUNG_THRESHOLD` allocations. Same ladder, same code: 8 collections, 0.5 s, no
change in the peak resident size. A young collection then takes tens of milliseconds of the
event loop, every few tens of seconds in a burst.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
OLDER_THRESHOLDS = (20, 20)


def tune() -> None:
    """Freeze what start-up made and collect less often; call once, before the event loop."""
    gc.collect()  # what start-up left as garbage goes now, not into the permanent generation
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
