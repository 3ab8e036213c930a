"""The informer's protocol: pages, resumed watches, bookmarks, 410 Gone and relists, against a
scripted list call that answers as the apiserver does (each answer in the order asked)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tpujob.kube.indexes import Change, Indexer, object_key
from tpujob.kube.informer import (
    MAX_BACKOFF_SECONDS,
    Informer,
    Watched,
    backoff_seconds,
    decode,
    namespace_filter,
    split_lines,
)


def obj(name: str, version: int, namespace: str = "team") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": str(version),
            "labels": {"job": "train"},
        }
    }


class Listing:
    def __init__(self, items: list[dict[str, Any]], version: int, token: str = "") -> None:
        meta = {"resourceVersion": str(version), **({"continue": token} if token else {})}
        self.data = json.dumps({"items": items, "metadata": meta}).encode()


class Stream:
    """A watch answer: these chunks, then (`hold`) silence until the test ends, as a quiet
    watch is until the apiserver closes it."""

    def __init__(self, chunks: list[bytes], hold: threading.Event | None = None) -> None:
        self.chunks, self.hold = chunks, hold

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        yield from self.chunks
        if self.hold is not None:
            self.hold.wait(10)

    def release_conn(self) -> None:
        return None


def lines(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in events)


class Script:
    """The list call: each call takes the next answer (an exception is raised)."""

    def __init__(self, answers: list[Any], hold: threading.Event) -> None:
        self.answers, self.hold = answers, hold
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if not self.answers:
            return Stream([], self.hold)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def names(raw: Mapping[str, Any]) -> dict[Hashable, str]:
    return {object_key(raw): raw["metadata"]["resourceVersion"]}


def run(
    answers: list[Any], done: Callable[[list[Change]], bool]
) -> tuple[Script, Indexer, list[Change]]:
    hold = threading.Event()
    script = Script(answers, hold)
    indexer = Indexer({"names": names})
    seen: list[Change] = []

    async def main() -> None:
        informer = Informer(
            Watched("test objects", script, "job"), indexer, seen.append, asyncio.get_running_loop()
        )
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            await until(lambda: done(seen), lambda: f"seen {seen}")
        finally:
            informer.stop()
            hold.set()

    asyncio.run(main())
    return script, indexer, seen


def held(indexer: Indexer) -> dict[Hashable, list[str]]:
    return {k: list(v) for k, v in indexer.indexes["names"].items()}


def test_a_paged_listing_then_a_watch_resumed_from_the_bookmark() -> None:
    a, b = obj("a", 5), obj("b", 6)
    bookmark = {"metadata": {"resourceVersion": "15"}}
    event = lines(("ADDED", obj("c", 11)), ("MODIFIED", obj("a", 12)))
    answers = [
        Listing([a], 10, token="next"),
        Listing([b], 10),
        # An event split across chunks, and a bookmark, then the stream ends.
        Stream([event[:7], event[7:], lines(("BOOKMARK", bookmark))]),
        Stream([lines(("DELETED", obj("b", 16)))]),
    ]
    script, indexer, seen = run(answers, lambda seen: any(c.type == "DELETED" for c in seen))
    assert held(indexer) == {("team", "a"): ["12"], ("team", "c"): ["11"]}
    assert [(c.type, object_key(c.body)) for c in seen] == [
        (None, ("team", "a")),
        (None, ("team", "b")),
        ("ADDED", ("team", "c")),
        ("MODIFIED", ("team", "a")),
        ("DELETED", ("team", "b")),
    ]
    # The second page asked with the first's token; every call with the server-side selector.
    assert script.calls[1]["_continue"] == "next"
    assert all(call["label_selector"] == "job" for call in script.calls)
    watches = [call for call in script.calls if call.get("watch")]
    assert [w["resource_version"] for w in watches[:2]] == ["10", "15"]
    assert all(w["allow_watch_bookmarks"] for w in watches)


@pytest.mark.parametrize("how", ["error event", "answer 410"])
def test_a_version_gone_lists_again_and_what_went_meanwhile_is_deleted(how: str) -> None:
    gone: Any = (
        Stream([lines(("ERROR", {"kind": "Status", "code": 410, "message": "too old"}))])
        if how == "error event"
        else ApiException(status=410, reason="Gone")
    )
    answers = [Listing([obj("a", 5), obj("b", 6)], 10), gone, Listing([obj("b", 20)], 30)]
    script, indexer, seen = run(answers, lambda seen: len(seen) >= 4)
    assert held(indexer) == {("team", "b"): ["20"]}
    assert [(c.type, object_key(c.body)) for c in seen[2:]] == [
        (None, ("team", "b")),
        ("DELETED", ("team", "a")),
    ]
    assert script.calls[-1]["resource_version"] == "30"


def test_a_failed_watch_is_retried_from_where_it_was() -> None:
    answers = [
        Listing([obj("a", 5)], 10),
        ApiException(status=500, reason="Internal"),
        Stream([lines(("ADDED", obj("b", 11)))]),
    ]
    script, indexer, _ = run(answers, lambda seen: len(seen) >= 2)
    assert sorted(held(indexer)) == [("team", "a"), ("team", "b")]
    watches = [call["resource_version"] for call in script.calls if call.get("watch")]
    assert watches[:2] == ["10", "10"]


def test_objects_outside_the_watched_namespaces_are_never_parsed() -> None:
    hold = threading.Event()
    listing = Listing([obj("a", 5, "team-a"), obj("b", 6, "kube-system")], 10)
    script = Script([listing], hold)
    parsed: list[str] = []

    def parse(raw: Mapping[str, Any]) -> dict[Hashable, str]:
        parsed.append(raw["metadata"]["name"])
        return names(raw)

    indexer = Indexer({"names": parse})
    accept = namespace_filter(["team-*"])
    assert accept is not None

    async def main() -> None:
        watched = Watched("pods", script, accept=accept)
        informer = Informer(watched, indexer, lambda change: None, asyncio.get_running_loop())
        informer.start()
        await asyncio.wait_for(informer.synced.wait(), 5)
        informer.stop()
        hold.set()

    asyncio.run(main())
    assert parsed == ["a"]


@pytest.mark.parametrize(
    ("patterns", "accepted", "refused"),
    [
        (["team-a", "team-b"], None, None),  # plain names: each watched on its own
        (["team-*"], ["team-a", "team-xyz"], ["ml", "kube-system"]),
        (["team-*,!team-secret"], ["team-a"], ["team-secret", "ml"]),
        (["!kube-*"], ["team-a", "default"], ["kube-system", "kube-public"]),
        (["ml", "team-?"], ["ml", "team-a"], ["team-ab", "mlx"]),
    ],
)
def test_namespace_patterns_accept_as_the_operator_s_namespace_option_says(
    patterns: list[str], accepted: list[str] | None, refused: list[str] | None
) -> None:
    accept = namespace_filter(patterns)
    if accepted is None:
        assert accept is None
        return
    assert accept is not None
    assert all(accept(ns) for ns in accepted)
    assert not any(accept(ns) for ns in refused or ())


@pytest.mark.parametrize(
    "raw",
    [
        b'{"type":"ADDED","object":{"metadata":{"name":"p","labels":{"a":"\\u00e9"}}}}',
        b'{"object":{"spec":{"n":9223372036854775807,"m":-9223372036854775808,"s":"\\ud83d\\ude00"}}}',
        b'{"a":[1,2.5,null,true]}',
    ],
)
def test_a_stream_document_decodes_as_the_standard_library_reads_it(raw: bytes) -> None:
    assert decode(raw) == json.loads(raw)


@pytest.mark.parametrize(
    ("chunks", "expected", "left"),
    [
        ([b'{"a":1}\n'], [[b'{"a":1}']], b""),
        ([b'{"a":', b'1}\n{"b"', b":2}\n"], [[], [b'{"a":1}'], [b'{"b":2}']], b""),
        ([b'{"a":1}\n\n{"b":2}'], [[b'{"a":1}']], b'{"b":2}'),
    ],
)
def test_stream_chunks_become_whole_lines(
    chunks: list[bytes], expected: list[list[bytes]], left: bytes
) -> None:
    buffer = bytearray()
    assert [split_lines(buffer, chunk) for chunk in chunks] == expected
    assert bytes(buffer) == left


def test_the_backoff_grows_to_its_cap() -> None:
    delays = [backoff_seconds(n, 0.5) for n in range(1, 12)]
    assert delays == sorted(delays)
    assert delays[-1] == MAX_BACKOFF_SECONDS
    assert backoff_seconds(1, 0.0) < backoff_seconds(1, 0.99)


def test_a_broken_stream_says_so_until_retry_now_brings_it_back_fresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failure is a break, and the watch's return ends it; the first listing ends none.
    The backoff here is a minute: only `retry_now` can bring the stream back within the test."""
    monkeypatch.setattr("tpujob.kube.informer.backoff_seconds", lambda *_: 60.0)
    hold = threading.Event()
    back = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    script = Script([Listing([obj("a", 5)], 10), ApiException(status=0, reason="refused")], hold)
    states: list[tuple[bool, datetime | None]] = []

    async def main() -> None:
        informer = Informer(
            Watched("test objects", script, "job"),
            Indexer({"names": names}),
            lambda _: None,
            asyncio.get_running_loop(),
            clock=lambda: back,
        )
        informer.start()
        try:
            await asyncio.wait_for(informer.synced.wait(), 5)
            await until(lambda: informer.broken)
            states.append((informer.broken, informer.resumed_at))
            informer.retry_now()
            await until(lambda: not informer.broken)
            states.append((informer.broken, informer.resumed_at))
        finally:
            informer.stop()
            hold.set()

    asyncio.run(main())
    # No `resumed_at` while broken: the first listing was no return from a break.
    assert states == [(True, None), (False, back)]
    watches = [call["resource_version"] for call in script.calls if call.get("watch")]
    assert watches[:2] == ["10", "10"]  # resumed from where it was, no listing again


async def until(condition: Callable[[], bool], state: Callable[[], str] = str) -> None:
    """Poll `condition` in the loop (the informer's state changes there) for up to 5 s."""
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not reached; {state()}")
