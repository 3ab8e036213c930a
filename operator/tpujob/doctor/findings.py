"""What the doctor reads and what it finds: the snapshot of the cluster, the checks by name,
and a finding with its level and what to do. Values only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from tpujob.gcp.catalogue import Catalogue


class Level(IntEnum):
    OK = 0
    INFO = 1
    WARNING = 2
    PROBLEM = 3  # the cluster cannot run jobs as it is: the exit status is non-zero

    def __str__(self) -> str:
        return self.name.lower()


class Check(StrEnum):
    CRD = "crd"
    OPERATOR = "operator"
    NODE_POOLS = "node-pools"
    POD_SECURITY = "pod-security"
    CATALOGUE = "catalogue"
    QUEUES = "queues"


@dataclass(frozen=True)
class Finding:
    check: Check
    level: Level
    subject: str
    message: str
    action: str = ""

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["check"], data["level"] = str(self.check), str(self.level)
        return data


@dataclass(frozen=True)
class Snapshot:
    """What the doctor read; None where it could not read (the reason in `unreadable`)."""

    crd: Mapping[str, Any] | None = None
    operator_pods: Sequence[Mapping[str, Any]] = ()
    nodes: Sequence[Mapping[str, Any]] = ()
    tpu_pods: Sequence[Mapping[str, Any]] = ()  # pods that request google.com/tpu
    namespaces: Sequence[Mapping[str, Any]] = ()
    jobs: Sequence[Mapping[str, Any]] = ()
    catalogue: Catalogue | None = None
    unreadable: Mapping[Check, str] = field(default_factory=dict)
