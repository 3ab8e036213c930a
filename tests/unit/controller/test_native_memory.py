"""glibc gives back what the operator freed: the arena limit takes, and a trim lowers RSS."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

from tpujob.controller import native_memory

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or native_memory._glibc() is None,
    reason="mallopt and malloc_trim are glibc's",
)


def resident_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@glibc_only
def test_the_arena_limit_is_taken() -> None:
    assert native_memory.limit_arenas(native_memory.ARENAS)


@glibc_only
def test_a_trim_returns_the_free_pages_between_objects_still_alive() -> None:
    """Freed 4 KiB blocks between survivors stay resident until trimmed (brk cannot shrink
    past a live block); a trim gives most of them back."""
    native_memory.trim()
    blocks = [bytes(4096) for _ in range(16_384)]  # 64 MiB, each block from malloc
    kept = blocks[::16]
    del blocks
    before = resident_kib()
    assert native_memory.trim()
    after = resident_kib()
    assert len(kept) == 1024
    assert before - after > 32 * 1024, (before, after)


def test_without_glibc_both_are_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    native_memory._glibc.cache_clear()
    try:
        assert not native_memory.limit_arenas() and not native_memory.trim()
    finally:
        native_memory._glibc.cache_clear()
