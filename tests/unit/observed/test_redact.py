"""Obvious secrets in log lines are masked before the lines become evidence or Events."""

from __future__ import annotations

import time

import pytest

from tpujob.observed.redact import MASK, SecretKind, found, redact

AWS_KEY = "AKIA" + "ABCDEFGHIJKLMNOP"
GCP_KEY = "AIza" + "SyA1234567890abcdefghijklmnopqrstuv"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLXBhcnQ"

# (line, what must be gone, what must stay, kind)
CASES = [
    (
        "Authorization: Bearer abcdef0123456789xyz",
        "abcdef0123456789xyz",
        "Authorization: Bearer",
        SecretKind.BEARER_TOKEN,
    ),
    (
        "connecting to postgres://trainer:s3cr3t-pw@db:5432/runs failed",
        "s3cr3t-pw",
        "postgres://trainer:",
        SecretKind.URL_PASSWORD,
    ),
    (
        "retry https://user:hunter2@storage.example.com/bucket",
        "hunter2",
        "@storage.example.com/bucket",
        SecretKind.URL_PASSWORD,
    ),
    ("login password=hunter2 rejected", "hunter2", "login password=", SecretKind.KEY_VALUE),
    ('config: {"api_key": "k-12345", "lr": 0.1}', "k-12345", '"lr": 0.1', SecretKind.KEY_VALUE),
    ("GET /v1/x?token=abc123&step=5", "abc123", "&step=5", SecretKind.KEY_VALUE),
    ("CLIENT_SECRET: xyz987 loaded", "xyz987", "loaded", SecretKind.KEY_VALUE),
    (f"aws key {AWS_KEY} invalid", AWS_KEY, "aws key", SecretKind.AWS_ACCESS_KEY),
    (f"calling api with key={GCP_KEY}", GCP_KEY, "calling api", SecretKind.GCP_API_KEY),
    (
        "oauth ya29.a0AfH6SMBx-abcdefghijklmnopqrstu expired",
        "ya29.a0AfH6SMBx",
        "expired",
        SecretKind.GCP_OAUTH_TOKEN,
    ),
    ("pushing with ghp_" + "a" * 36, "ghp_" + "a" * 36, "pushing with", SecretKind.GITHUB_TOKEN),
    (f"service account token {JWT} rejected", JWT, "rejected", SecretKind.JWT),
    (
        "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
        "MIIEowIBAAKCAQEA",
        "",
        SecretKind.PRIVATE_KEY,
    ),
    (
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq (log cut here",
        "MIIEvQIBADANBgkq",
        "",
        SecretKind.PRIVATE_KEY,
    ),
]


@pytest.mark.parametrize(
    ("line", "secret", "kept", "kind"),
    CASES,
    ids=[str(c[3]) + f"-{i}" for i, c in enumerate(CASES)],
)
def test_secret_is_masked_and_the_rest_of_the_line_kept(
    line: str, secret: str, kept: str, kind: SecretKind
) -> None:
    out = redact(line)
    assert secret not in out
    assert MASK in out
    assert kept in out
    assert kind in found(line)


@pytest.mark.parametrize(
    "line",
    [
        "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory allocating 2.00GiB",
        "step 120 loss 0.4312 tokens/s 51234",
        "max_token_length=512 vocab=32000",
        "connecting to https://storage.googleapis.com/bucket/ckpt/120",
        "Traceback (most recent call last):",
        "ValueError: shapes (4, 8) and (16,) do not match",
        "checkpoint written to gs://bucket/run-7/step_000120",
    ],
    ids=[
        "oom",
        "throughput",
        "token-length",
        "url-without-password",
        "traceback",
        "shapes",
        "checkpoint-uri",
    ],
)
def test_ordinary_log_lines_are_left_alone(line: str) -> None:
    assert redact(line) == line
    assert found(line) == frozenset()


def test_redacting_is_idempotent() -> None:
    once = redact("password=hunter2 and Bearer abcdefghijklmnop")
    assert redact(once) == once


def test_a_long_hostile_line_is_redacted_in_linear_time() -> None:
    hostile = ("password" + "=" * 3 + "a" * 50_000 + " ") * 4 + "Bearer " + "x" * 100_000
    started = time.perf_counter()
    redact(hostile)
    assert time.perf_counter() - started < 1.0
