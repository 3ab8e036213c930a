"""Redacting obvious secrets from text copied out of trainer logs.

Pure. Log lines become status evidence and Events, which everyone who may read the job sees,
while the log itself may print a token, a key or a URL with a password. `redact` replaces the
secret part of each shape below with `[REDACTED]` and keeps the rest, so the line still says
what failed. It is a safety net for the obvious shapes, not a guarantee: a secret printed bare
and shapeless cannot be told from any other word.

Every pattern is linear (no nested quantifiers, no backtracking over overlapping classes), as
input from a log is untrusted and may be long.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass

MASK = "[REDACTED]"


class SecretKind(enum.StrEnum):
    """The shapes of secret `redact` recognises."""

    PRIVATE_KEY = "private-key"
    BEARER_TOKEN = "bearer-token"
    URL_PASSWORD = "url-password"
    KEY_VALUE = "key-value"
    AWS_ACCESS_KEY = "aws-access-key"
    GCP_API_KEY = "gcp-api-key"
    GCP_OAUTH_TOKEN = "gcp-oauth-token"
    GITHUB_TOKEN = "github-token"
    JWT = "jwt"


@dataclass(frozen=True)
class _Shape:
    kind: SecretKind
    pattern: re.Pattern[str]
    # The group holding the secret; the text around it is kept.
    group: int = 0


# Names whose value is a secret in `name=value`, `name: value` and JSON `"name": "value"`.
_SECRET_NAMES = (
    r"(?:password|passwd|pwd|secret|client_secret|token|access_token|refresh_token|id_token|"
    r"auth_token|api_key|apikey|api-key|access_key|secret_key|aws_secret_access_key|"
    r"private_key|credentials?)"
)

_SHAPES: tuple[_Shape, ...] = (
    # A PEM private key, its body possibly cut off by the log tail.
    _Shape(
        SecretKind.PRIVATE_KEY,
        re.compile(
            r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[^-]*"
            r"(?:-----END [A-Z ]{0,40}PRIVATE KEY-----)?"
        ),
    ),
    _Shape(
        SecretKind.BEARER_TOKEN,
        re.compile(r"\b(?:Bearer|Basic)\s+([A-Za-z0-9._~+/=-]{8,})", re.IGNORECASE),
        1,
    ),
    # scheme://user:password@host: the password only.
    _Shape(
        SecretKind.URL_PASSWORD,
        re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,20}://[^\s:/@]{1,256}:([^\s@/]{1,256})@"),
        1,
    ),
    _Shape(
        SecretKind.KEY_VALUE,
        re.compile(
            r"(?i)[\"']?\b" + _SECRET_NAMES + r"[\"']?\s{0,3}[=:]\s{0,3}[\"']?([^\s\"',;&]{1,512})"
        ),
        1,
    ),
    _Shape(SecretKind.AWS_ACCESS_KEY, re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    _Shape(SecretKind.GCP_API_KEY, re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    _Shape(SecretKind.GCP_OAUTH_TOKEN, re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}")),
    _Shape(
        SecretKind.GITHUB_TOKEN,
        re.compile(
            r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|"
            r"github_pat_[A-Za-z0-9_]{22,})"
        ),
    ),
    _Shape(
        SecretKind.JWT,
        re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}"),
    ),
)


def redact(text: str) -> str:
    """`text` with the secret part of every recognised shape replaced by `[REDACTED]`."""
    for shape in _SHAPES:
        text = shape.pattern.sub(functools.partial(_mask, group=shape.group), text)
    return text


def found(text: str) -> frozenset[SecretKind]:
    """The kinds of secret `text` holds (for tests and for counting what was redacted)."""
    return frozenset(s.kind for s in _SHAPES if s.pattern.search(text))


def _mask(match: re.Match[str], *, group: int) -> str:
    if group == 0:
        return MASK
    start, end = match.span(group)
    whole_start = match.start()
    return match.group(0)[: start - whole_start] + MASK + match.group(0)[end - whole_start :]
