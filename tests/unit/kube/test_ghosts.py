"""Ghosts: an object the cache holds is dropped only when two lists in a row miss it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from tpujob.kube.ghosts import GhostFinder
from tpujob.kube.uids import _uids


@pytest.mark.parametrize(
    ("rounds", "ghosts"),
    [
        # (cached, listed) per list, oldest first
        ([({"a", "b"}, {"a", "b"})], set()),
        ([({"a", "b"}, {"a"})], set()),  # missing once: maybe newer than the list
        ([({"a", "b"}, {"a"}), ({"a", "b"}, {"a"})], {"b"}),
        ([({"a", "b"}, {"a"}), ({"a", "b"}, {"a", "b"})], set()),  # it showed again
        ([({"a", "b"}, {"a"}), ({"a"}, {"a"})], set()),  # it left the cache: a DELETED came
        ([({"a", "b"}, {"a"}), ({"a", "c"}, {"a"})], set()),  # c is new: missing once
        ([({"a", "b"}, {"a"}), ({"a", "b"}, {"a"}), ({"a", "b"}, {"a", "b"})], set()),
        ([({"", "a"}, set()), ({"", "a"}, set())], {"a"}),  # no uid is nothing to drop
    ],
    ids=[
        "all-listed",
        "missing-once",
        "missing-twice",
        "back-in-the-second-list",
        "left-the-cache",
        "another-missing-once",
        "a-ghost-that-shows-again",
        "empty-uid",
    ],
)
def test_only_what_two_lists_in_a_row_miss_is_a_ghost(
    rounds: list[tuple[set[str], set[str]]], ghosts: set[str]
) -> None:
    finder = GhostFinder()
    for cached, listed in rounds:
        finder.compare(cached, listed)
    assert finder.ghosts == ghosts


def test_uids_are_read_from_every_page_of_a_metadata_only_list() -> None:
    pages = {
        None: {
            "items": [{"metadata": {"uid": "a"}}, {"metadata": {}}],
            "metadata": {"continue": "p2"},
        },
        "p2": {"items": [{"metadata": {"uid": "b"}}], "metadata": {}},
    }
    asked: list[dict[str, Any]] = []

    def list_page(**kwargs: Any) -> Any:
        asked.append(kwargs)
        return SimpleNamespace(data=json.dumps(pages[kwargs.get("_continue")]).encode())

    assert _uids(list_page) == {"a", "b"}
    assert [kw.get("_continue") for kw in asked] == [None, "p2"]
    assert all("PartialObjectMetadataList" in kw["_headers"]["Accept"] for kw in asked)
