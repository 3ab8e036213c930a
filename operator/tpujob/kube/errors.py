"""Typed API errors, translated from the client's errors at the adapter's edge.

Every call carries a request timeout, so a hung connection cannot hold a reconcile. Errors that
say "try again soon" (connection refused or reset while the apiserver restarts, timeouts, 429
and 5xx answers) become `UnavailableError`, which the handlers retry after a short, jittered
pause instead of falling back to kopf's long backoff.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

P = ParamSpec("P")
T = TypeVar("T")


class KubeError(RuntimeError):
    """An API call failed; `status` is the HTTP status, `reason` the API's reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFoundError(KubeError):
    pass


class ConflictError(KubeError):
    pass


class ForbiddenError(KubeError):
    pass


class InvalidError(KubeError):
    pass


class UnavailableError(KubeError):
    """The apiserver could not answer now (unreachable, timed out, throttled, 5xx)."""

    @property
    def unreachable(self) -> bool:
        """No answer came at all (refused, reset, timed out): the API is down for everyone.
        A 429 or 5xx is an answer about one request (a failing admission webhook on one
        job's pods, one flow's fair share) and says nothing of the others'."""
        return self.status == 0


# (connect, read) seconds for every call; a watch-free reconcile never needs longer.
REQUEST_TIMEOUT = (5.0, 30.0)


_BY_STATUS: dict[int, type[KubeError]] = {
    404: NotFoundError,
    409: ConflictError,
    403: ForbiddenError,
    422: InvalidError,
}


def translate(err: ApiException) -> KubeError:
    reason, message = str(err.reason or ""), str(err.body or "")
    try:
        body = json.loads(err.body or "{}")
        reason, message = body.get("reason", reason), body.get("message", message)
    except (TypeError, ValueError):
        pass
    status = int(err.status or 0)
    kind = _BY_STATUS.get(status, KubeError)
    if status == 429 or status >= 500:
        kind = UnavailableError
    return kind(status, reason, message)


def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call a client method, raising our typed errors (the original chained as the cause)."""
    options: dict[str, Any] = kwargs
    options.setdefault("_request_timeout", REQUEST_TIMEOUT)
    try:
        return fn(*args, **kwargs)
    except ApiException as err:
        raise translate(err) from err
    except (urllib3.exceptions.HTTPError, OSError) as err:
        # Connection refused/reset, DNS, read timeouts: the apiserver is restarting or slow.
        raise UnavailableError(0, type(err).__name__, str(err)[:512]) from err
