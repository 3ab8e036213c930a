"""What JAX's persistent compilation cache did for this process: hits, misses, seconds saved.

The operator points JAX at a cache folder every attempt of a job sees
(`contract.ENV_JAX_COMPILATION_CACHE_DIR`), so a restarted worker loads the executables an
earlier attempt compiled. JAX reports each cache lookup as a monitoring event; `watch` counts
them, and the step driver logs the count once, after the first step (which is when the training
step itself is compiled or loaded), so a log says whether a restart paid for compiling again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HIT = "/jax/compilation_cache/cache_hits"
MISS = "/jax/compilation_cache/cache_misses"
SAVED = "/jax/compilation_cache/compile_time_saved_sec"


@dataclass
class CacheUse:
    """The lookups of one process in the cache at `directory`."""

    directory: str
    hits: int = 0
    misses: int = 0
    saved_seconds: float = 0.0

    def on_event(self, event: str, **_: Any) -> None:
        if event == HIT:
            self.hits += 1
        elif event == MISS:
            self.misses += 1

    def on_duration(self, event: str, duration_secs: float, **_: Any) -> None:
        if event == SAVED:
            self.saved_seconds += max(0.0, duration_secs)

    def summary(self) -> str:
        return (
            f"compilation cache {self.directory}: {self.hits} hits, {self.misses} misses, "
            f"{self.saved_seconds:.1f}s of compiling saved"
        )


def watch() -> CacheUse | None:
    """Count this process's cache lookups from now on; None when JAX has no cache folder."""
    import jax

    directory = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    if not directory:
        return None
    use = CacheUse(str(directory))
    jax.monitoring.register_event_listener(use.on_event)
    jax.monitoring.register_event_duration_secs_listener(use.on_duration)
    return use
