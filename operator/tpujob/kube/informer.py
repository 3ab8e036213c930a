"""List and watch one kind of object, feeding its indexes and telling a handler of each change.

The operator's own informer for the kinds it watches in bulk (its pods, its heartbeat Leases,
every Node), in place of a framework's per-event machinery: one stream per kind and scope, the
label selector applied by the apiserver, each object parsed once in the informer's own thread
(`Indexer.prepare`), and the parsed entries handed to the event loop a chunk of the stream at a
time, where the indexes change and the handler runs (so reconciles, which read the indexes in
the loop, never see one half-changed).

A watch resumes from the last resourceVersion it saw (bookmarks keep it fresh while nothing
changes). When the apiserver no longer has that version (410 Gone: a long outage, an apiserver
restart), the informer lists again, and what the listing no longer shows leaves the indexes as
deleted, with a DELETED change for the handler: no entry outlives its object because a watch
broke. Other errors are retried with a capped, jittered backoff, cut short by `retry_now` (the
operator calls it once the apiserver answers again after an outage).

While a stream is broken its indexes may be stale: `broken` says so, and `resumed_at` says when
they were fresh again after the last break, so that a clock judged on what the stream shows (a
heartbeat's age) does not run while the stream could not show anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import orjson
from kubernetes.client.exceptions import ApiException

from tpujob.kube.indexes import DELETED, Change, Indexer, Prepared

GONE = 410
PAGE = 500
# The apiserver ends each watch after this long, and the informer starts the next from the
# version it reached; the client gives up on a silent stream a while after that.
WATCH_SECONDS = 60
CONNECT_TIMEOUT_SECONDS = 10.0
READ_GRACE_SECONDS = 30.0
# An operator runs a handful of streams, so retrying them often costs the apiserver little;
# while one is down the clocks judged on it are held and its changes unseen, so the cap is short.
MAX_BACKOFF_SECONDS = 8.0

Handler = Callable[[Change], None]
_log = logging.getLogger(__name__)


class GoneError(Exception):
    """The version a watch would resume from is older than the apiserver keeps."""


class WatchError(Exception):
    """The apiserver ended a watch with an error event."""


class _StoppedError(Exception):
    """The event loop closed: the operator is stopping."""


@dataclass(frozen=True)
class Watched:
    """A kind of object in one scope: `list_objects` is the client's list call for it (all
    namespaces, one namespace, or a cluster-scoped kind), given its keyword arguments."""

    what: str  # for the logs: "pods in team-a"
    list_objects: Callable[..., Any]
    label_selector: str | None = None
    # The one namespace listed (None: all, or a cluster-scoped kind): a listing shows objects
    # gone from this namespace only, where informers of other namespaces share the indexes.
    namespace: str | None = None
    # Objects outside the watched namespaces (a glob) are dropped before they are parsed.
    accept: Callable[[str], bool] = lambda namespace: True
    kind: str = ""  # which of its streams, for the operator: "pods", "nodes", "leases"


def namespace_filter(patterns: Iterable[str]) -> Callable[[str], bool] | None:
    """What the operator's `--namespace` values accept, when they are more than plain names
    (None: plain names, each watched on its own). Each value is a comma-separated list of
    globs, a `!` before one excluding what it matches; a namespace is watched if some value
    includes it (a value of exclusions only includes the rest) and excludes nothing of it."""
    values = tuple(patterns)
    if all(v and all(c.isalnum() or c == "-" for c in v) for v in values):
        return None
    parsed = [tuple(p.strip() for p in v.split(",") if p.strip()) for v in values]

    def accept(namespace: str) -> bool:
        for value in parsed:
            includes = [p for p in value if not p.startswith("!")]
            excludes = [p[1:] for p in value if p.startswith("!")]
            if (not includes or any(fnmatchcase(namespace, p) for p in includes)) and not any(
                fnmatchcase(namespace, p) for p in excludes
            ):
                return True
        return False

    return accept


def decode(raw: bytes) -> Any:
    """One JSON document of a listing or a watch stream.

    orjson takes half the time of the standard library's decoder here, where most of the
    operator's reading happens (every event of every pod it watches). It reads an integer past
    64 bits as a float; the kinds watched (pods, nodes, Leases) hold none, as the apiserver
    validates their numbers as 32- or 64-bit integers.
    """
    return orjson.loads(raw)


def split_lines(buffer: bytearray, chunk: bytes) -> list[bytes]:
    """Append `chunk` to `buffer`; take out and return the complete lines it now holds."""
    buffer.extend(chunk)
    end = buffer.rfind(b"\n")
    if end < 0:
        return []
    lines = bytes(buffer[:end]).split(b"\n")
    del buffer[: end + 1]
    return [line for line in lines if line.strip()]


def backoff_seconds(failures: int, jitter: float) -> float:
    """Before the next try after `failures` in a row; `jitter` is uniform in [0, 1)."""
    return float(min(MAX_BACKOFF_SECONDS, 0.5 * 2.0 ** min(failures, 8)) * (0.5 + jitter))


class Informer:
    """One kind in one scope, listed then watched in a daemon thread of its own."""

    def __init__(
        self,
        watched: Watched,
        indexer: Indexer,
        handler: Handler,
        loop: asyncio.AbstractEventLoop,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.watched, self.indexer, self._handler, self._loop = watched, indexer, handler, loop
        self._clock = clock
        self.synced = asyncio.Event()  # set, in the loop, once the first listing is applied
        # Both kept in the loop, in order with the changes the stream brings.
        self.broken = False
        self.resumed_at: dt.datetime | None = None
        self._stopping = threading.Event()
        self._retry = threading.Event()  # set: the backoff's wait ends now
        self._thread = threading.Thread(target=self._run, name=f"watch {watched.what}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """The thread ends at its stream's next line or end (it holds nothing to release)."""
        self._stopping.set()
        self._retry.set()

    def retry_now(self) -> None:
        """A stream waiting to retry after a failure tries again at once."""
        self._retry.set()

    # In the informer's thread.

    def _run(self) -> None:
        version: str | None = None
        failures = 0
        while not self._stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
                failures = 0
            except GoneError:
                _log.info("watch of %s: version gone, listing again", self.watched.what)
                self._break()
                version = None
            except _StoppedError:
                return
            except Exception as err:  # any failure of a stream is retried
                self._break()
                failures += 1
                delay = backoff_seconds(failures, random.random())
                _log.warning(
                    "watch of %s failed (%d in a row), again in %.1fs: %s",
                    self.watched.what,
                    failures,
                    delay,
                    err,
                )
                self._retry.wait(delay)
                self._retry.clear()

    def _break(self) -> None:
        with contextlib.suppress(_StoppedError):  # stopping: the loop ends the thread
            self._post(self._broke, None)

    def _list(self) -> str:
        listed: list[Prepared] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": PAGE, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            page = decode(self._call(**kwargs).data)
            listed.extend(self._prepared(page.get("items") or ()))
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                self._post(self._relisted, listed)
                return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str) -> str:
        response = self._call(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_SECONDS, WATCH_SECONDS + READ_GRACE_SECONDS),
        )
        # The watch resumes from the version the indexes reached: they are fresh from here on.
        self._post(self._resumed, None)
        buffer = bytearray()
        try:
            for chunk in response.stream(amt=None, decode_content=False):
                if self._stopping.is_set():
                    break
                batch: list[tuple[str, Prepared]] = []
                for line in split_lines(buffer, chunk):
                    version = self._event(decode(line), version, batch)
                if batch:
                    self._post(self._applied, batch)
        finally:
            response.release_conn()
        return version

    def _event(
        self, event: Mapping[str, Any], version: str, batch: list[tuple[str, Prepared]]
    ) -> str:
        kind, obj = str(event.get("type")), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == GONE:
                raise GoneError()
            raise WatchError(str(obj.get("message") or obj))
        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        if kind != "BOOKMARK":
            batch.extend((kind, p) for p in self._prepared((obj,)))
        return version

    def _prepared(self, objects: Iterable[Mapping[str, Any]]) -> Iterator[Prepared]:
        accept = self.watched.accept
        for obj in objects:
            if accept(str((obj.get("metadata") or {}).get("namespace") or "")):
                yield self.indexer.prepare(obj)

    def _call(self, **kwargs: Any) -> Any:
        if self.watched.label_selector:
            kwargs["label_selector"] = self.watched.label_selector
        try:
            return self.watched.list_objects(**kwargs)
        except ApiException as err:
            if err.status == GONE:
                raise GoneError() from err
            raise

    def _post(self, fn: Callable[[Any], None], arg: Any) -> None:
        """Run `fn(arg)` in the loop."""
        try:
            self._loop.call_soon_threadsafe(fn, arg)
        except RuntimeError as err:  # closed
            self._stopping.set()
            raise _StoppedError() from err

    # In the event loop.

    def _broke(self, _: None) -> None:
        self.broken = True

    def _resumed(self, _: None) -> None:
        if self.broken:
            self.broken = False
            self.resumed_at = self._clock()

    def _tell(self, change: Change) -> None:
        try:
            self._handler(change)
        except Exception:
            _log.exception("handling a change of %s failed", self.watched.what)

    def _applied(self, batch: list[tuple[str, Prepared]]) -> None:
        for kind, prepared in batch:
            self.indexer.apply(kind, prepared)
            self._tell(Change(kind, prepared.body))

    def _relisted(self, listed: list[Prepared]) -> None:
        changes = self.indexer.relist(listed, namespace=self.watched.namespace)
        gone = sum(change.type == DELETED for change in changes)
        if gone and self.synced.is_set():
            _log.warning(
                "watch of %s: dropped %d the cluster no longer has (deleted while no watch ran)",
                self.watched.what,
                gone,
            )
        for change in changes:
            self._tell(change)
        self._resumed(None)
        self.synced.set()
