"""Reads the zone catalogue from the Cloud TPU API (`TpuClient.list_accelerator_types`).

The only module that imports `google-cloud-tpu`, and only when called. Each zone is read on
its own: a zone the caller may not list (403), a zone that does not exist (404), or an API
that does not answer is recorded as that zone's problem, never raised, so the operator and
`tpujob doctor` go on without the catalogue. `CatalogueSource` keeps the last catalogue for
its owner (no module state) and says once, not on every read, that it is unavailable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tpujob.gcp.catalogue import Catalogue, Offer, ZoneProblem

log = logging.getLogger("tpujob.gcp")

DEFAULT_TIMEOUT_SECONDS = 10.0


class CatalogueUnavailableError(RuntimeError):
    """google-cloud-tpu is not installed (`pip install tpujob[gcp]`)."""

    reason = ZoneProblem.UNREACHABLE


@dataclass(frozen=True)
class CatalogueConfig:
    """Where to read the catalogue: a project, its TPU zones, optionally another endpoint."""

    project: str
    zones: tuple[str, ...]
    api_endpoint: str | None = None  # e.g. a private endpoint; None: the public API
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    anonymous: bool = False  # no credentials (tests against a local server)


def make_client(config: CatalogueConfig) -> Any:
    """A TpuClient over REST for `config`; imports google-cloud-tpu here and only here."""
    try:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import tpu_v2
    except ImportError as err:
        raise CatalogueUnavailableError(
            "google-cloud-tpu is not installed; install tpujob[gcp]"
        ) from err
    options = ClientOptions(api_endpoint=config.api_endpoint) if config.api_endpoint else None
    credentials = AnonymousCredentials() if config.anonymous else None  # type: ignore[no-untyped-call]
    return tpu_v2.TpuClient(transport="rest", client_options=options, credentials=credentials)


def _offer(raw: Any) -> Offer:
    configs = frozenset(
        (str(getattr(c.type_, "name", c.type_)), str(c.topology))
        for c in raw.accelerator_configs
        if c.topology
    )
    return Offer(type_name=str(raw.type_), configs=configs)


def _problem(err: Exception) -> tuple[ZoneProblem, str]:
    from google.api_core import exceptions as gexc

    if isinstance(err, gexc.Forbidden | gexc.Unauthorized):
        return ZoneProblem.PERMISSION_DENIED, f"permission denied: {err.message}"
    if isinstance(err, gexc.NotFound):
        return ZoneProblem.NOT_FOUND, f"not found: {err.message}"
    if isinstance(err, gexc.GoogleAPICallError) and not isinstance(
        err, gexc.ServerError | gexc.TooManyRequests
    ):
        return ZoneProblem.BAD_ANSWER, f"{type(err).__name__}: {err.message}"
    return ZoneProblem.UNREACHABLE, f"{type(err).__name__}: {str(err)[:200]}"


def read_catalogue(
    config: CatalogueConfig, *, client_factory: Callable[[CatalogueConfig], Any] = make_client
) -> Catalogue:
    """Every zone's offers (all pages); a zone that fails is listed with its problem."""
    client = client_factory(config)
    offers: dict[str, tuple[Offer, ...]] = {}
    problems: dict[str, tuple[ZoneProblem, str]] = {}
    for zone in config.zones:
        parent = f"projects/{config.project}/locations/{zone}"
        try:
            pager = client.list_accelerator_types(
                parent=parent, retry=None, timeout=config.timeout_seconds
            )
            offers[zone] = tuple(_offer(item) for item in pager)
        except Exception as err:  # every failure of one zone is that zone's problem
            problems[zone] = _problem(err)
    return Catalogue(project=config.project, offers=offers, problems=problems)


@dataclass
class CatalogueSource:
    """The catalogue for one operator (or one `doctor` run): read, kept, and told about once."""

    config: CatalogueConfig
    client_factory: Callable[[CatalogueConfig], Any] = make_client
    catalogue: Catalogue | None = None
    _told: set[str] = field(default_factory=set)

    def refresh(self) -> Catalogue | None:
        """Read the catalogue again; keep the last good one when this read finds nothing."""
        try:
            fresh = read_catalogue(self.config, client_factory=self.client_factory)
        except CatalogueUnavailableError as err:
            self._tell("install", f"zone catalogue off: {err}")
            return self.catalogue
        for zone, (problem, detail) in sorted(fresh.problems.items()):
            self._tell(
                f"{zone}:{problem}",
                f"zone catalogue: {zone} unreadable ({detail}); going on without it",
            )
        if fresh.usable or self.catalogue is None:
            self.catalogue = fresh
        return self.catalogue

    def _tell(self, key: str, message: str) -> None:
        if key not in self._told:
            self._told.add(key)
            log.warning(message)

    @property
    def told(self) -> tuple[str, ...]:
        return tuple(sorted(self._told))


def parse_zones(text: str | Sequence[str]) -> tuple[str, ...]:
    """Zones from a comma-separated flag or a list (chart values), deduplicated, in order."""
    items = text.split(",") if isinstance(text, str) else list(text)
    seen: list[str] = []
    for item in (i.strip() for i in items):
        if item and item not in seen:
            seen.append(item)
    return tuple(seen)
