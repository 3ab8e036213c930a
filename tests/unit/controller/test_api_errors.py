"""API errors become typed errors at the adapter's edge, and each gets the right retry."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tpujob.controller.handlers import (
    MAX_ERROR_RETRY_SECONDS,
    MAX_UNAVAILABLE_RETRY_SECONDS,
    retry_delay,
)
from tpujob.kube.errors import (
    REQUEST_TIMEOUT,
    ConflictError,
    ForbiddenError,
    InvalidError,
    KubeError,
    NotFoundError,
    UnavailableError,
    call,
)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (404, NotFoundError),
        (409, ConflictError),
        (403, ForbiddenError),
        (422, InvalidError),
        (429, UnavailableError),
        (500, UnavailableError),
        (503, UnavailableError),
        (504, UnavailableError),
        (400, KubeError),
    ],
    ids=str,
)
def test_api_answers_become_typed_errors(status: int, kind: type[KubeError]) -> None:
    def fail(**_: Any) -> None:
        raise ApiException(status=status, reason="why")

    with pytest.raises(kind) as caught:
        call(fail)
    assert type(caught.value) is kind
    assert caught.value.status == status


def test_an_unreachable_apiserver_is_unavailable_not_a_crash() -> None:
    config = client.Configuration(host=f"http://127.0.0.1:{closed_port()}")
    config.retries = False
    api = client.CoreV1Api(client.ApiClient(config))
    with pytest.raises(UnavailableError):
        call(api.list_node)


def test_every_call_carries_a_request_timeout_unless_given_one() -> None:
    seen: list[Any] = []

    def record(**kwargs: Any) -> None:
        seen.append(kwargs.get("_request_timeout"))

    call(record)
    call(record, _request_timeout=1.0)
    assert seen == [REQUEST_TIMEOUT, 1.0]


@pytest.mark.parametrize(
    ("err", "failures", "low", "high"),
    [
        (ConflictError(409, "Conflict", ""), 1, 0.05, 0.5),
        (ConflictError(409, "Conflict", ""), 9, 0.05, 0.5),
        (UnavailableError(0, "ConnectionRefused", ""), 1, 0.75, 1.25),
        (UnavailableError(503, "ServiceUnavailable", ""), 3, 3.0, 5.0),
        (
            UnavailableError(0, "ConnectionRefused", ""),
            9,
            6.0,
            MAX_UNAVAILABLE_RETRY_SECONDS * 1.25,
        ),
        (ForbiddenError(403, "Forbidden", ""), 1, 1.5, 2.5),
        (ValueError("a bug"), 2, 3.0, 5.0),
        (ValueError("a bug"), 50, 45.0, MAX_ERROR_RETRY_SECONDS * 1.25),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Exception) else str(v),
)
def test_retry_delay_by_error_kind(err: Exception, failures: int, low: float, high: float) -> None:
    delays = [retry_delay(err, failures, j) for j in (0.0, 0.5, 0.999)]
    assert all(low <= d <= high for d in delays), delays
    assert delays[0] < delays[-1]  # jittered, so racing retries spread out
