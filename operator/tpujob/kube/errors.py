"""Typed API errors, translated from the client's ApiException at the adapter's edge."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import ParamSpec, TypeVar

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


_BY_STATUS: dict[int, type[KubeError]] = {
    404: NotFoundError, 409: ConflictError, 403: ForbiddenError, 422: InvalidError}


def translate(err: ApiException) -> KubeError:
    reason, message = str(err.reason or ""), str(err.body or "")
    try:
        body = json.loads(err.body or "{}")
        reason, message = body.get("reason", reason), body.get("message", message)
    except (TypeError, ValueError):
        pass
    kind = _BY_STATUS.get(int(err.status or 0), KubeError)
    return kind(int(err.status or 0), reason, message)


def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Call a client method, raising our typed errors (the original chained as the cause)."""
    try:
        return fn(*args, **kwargs)
    except ApiException as err:
        raise translate(err) from err
