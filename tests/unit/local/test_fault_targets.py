"""Which process `tpujob local fault kill --leaf` signals: the deepest one under the container's
main process, read from a /proc tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpujob.local.faults import deepest_descendant


def fake_proc(root: Path, tree: dict[int, list[int]]) -> Path:
    """A /proc with `tree`'s parent -> children links, each parent's children split over two
    threads as the kernel lists them per task."""
    for pid, children in tree.items():
        half = len(children) // 2
        for tid, part in ((pid, children[:half]), (pid + 100_000, children[half:])):
            task = root / str(pid) / "task" / str(tid)
            task.mkdir(parents=True)
            (task / "children").write_text(" ".join(str(c) for c in part) + " ")
    return root


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        pytest.param({10: []}, 10, id="a main process alone is its own leaf"),
        pytest.param({10: [11], 11: []}, 11, id="a supervisor's child"),
        pytest.param({10: [11], 11: [12], 12: []}, 12, id="an agent, its shell, the trainer"),
        pytest.param({10: [11, 13], 11: [], 13: [14], 14: []}, 14, id="the deeper branch"),
        pytest.param({10: [11, 12], 11: [], 12: []}, 12, id="the highest pid at one depth"),
    ],
)
def test_the_deepest_process_under_the_main_one_is_signalled(
    tmp_path: Path, tree: dict[int, list[int]], expected: int
) -> None:
    assert deepest_descendant(10, fake_proc(tmp_path, tree)) == expected


def test_a_process_gone_while_it_is_read_counts_as_childless(tmp_path: Path) -> None:
    # 11 is listed as a child but has already exited: no task folder is left of it.
    proc = fake_proc(tmp_path, {10: [11]})
    assert deepest_descendant(10, proc) == 11
    assert deepest_descendant(99, proc) == 99
