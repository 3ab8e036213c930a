"""Which cluster and namespace a CLI command reads, chosen as kubectl chooses them, and why it
cannot read them, in one line.

`get`, `describe` and `doctor` share the options (`--kubeconfig`, `--context`, and for the
namespaced ones `-n`) and the errors: a bad kubeconfig, an unreachable apiserver or a refused
read becomes a `ClusterError`, which `tpujob.cli.main` prints as one line on stderr (exit 1).
A person who typed the wrong context needs the reason, not the client's traceback.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import urllib3
import yaml
from kubernetes.config import ConfigException

from tpujob.cli_output import CommandError
from tpujob.kube.client import api_client, context_namespace
from tpujob.kube.errors import KubeError, UnavailableError, call

P = ParamSpec("P")
T = TypeVar("T")

# Where the client looks when neither --kubeconfig nor $KUBECONFIG names a file.
DEFAULT_KUBECONFIG = "~/.kube/config"


class ClusterError(CommandError):
    """The command cannot be answered from the cluster; the message is one line for people."""


def one_line(text: object, limit: int = 300) -> str:
    """`text` with its white space folded, cut at `limit` characters."""
    folded = " ".join(str(text).split())
    return folded if len(folded) <= limit else folded[: limit - 3] + "..."


def add_cluster_options(parser: argparse.ArgumentParser, *, namespaced: bool) -> None:
    """kubectl's options for choosing the cluster (and, for `namespaced`, the namespace)."""
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--context", default=None, help="the kubeconfig context to use")
    if namespaced:
        parser.add_argument(
            "-n", "--namespace", default=None, help="default: the context's namespace"
        )


def why_unreachable(err: BaseException) -> str:
    """The root of a failed connection in words ('connection refused'), not a pool's repr."""
    root: BaseException = err
    for _ in range(8):  # a chain is a few links long; a cycle must not hang the command
        # urllib3 keeps the last error of its retries as `reason`, the socket's as the cause.
        reason = getattr(root, "reason", None)
        deeper = reason if isinstance(reason, BaseException) else root.__cause__
        if deeper is None:
            break
        root = deeper
    if isinstance(root, TimeoutError | urllib3.exceptions.TimeoutError):
        return "timed out"
    if isinstance(root, OSError) and root.strerror:
        return one_line(root.strerror).lower()
    return one_line(root)


@dataclass(frozen=True)
class Cluster:
    """A cluster to read: the API client and the namespace a command means without -n."""

    api: Any  # kubernetes.client.ApiClient
    namespace: str

    @property
    def host(self) -> str:
        return str(self.api.configuration.host)

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn` called through `tpujob.kube.errors.call`, its errors said in one line."""
        try:
            return call(fn, *args, **kwargs)
        except KubeError as err:
            raise self.explain(err) from err

    def explain(self, err: KubeError) -> ClusterError:
        if isinstance(err, UnavailableError) and err.unreachable:
            cause = err.__cause__ or err
            return ClusterError(
                f"cannot reach the cluster at {self.host}: {why_unreachable(cause)}"
            )
        return ClusterError(f"{err.reason or err.status}: {one_line(err.message)}")


def connect(kubeconfig: str | None, context: str | None) -> Cluster:
    """The cluster of `kubeconfig` at `context` (by default its current one)."""
    where = kubeconfig or os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    try:
        return Cluster(
            api_client(kubeconfig, context=context), context_namespace(kubeconfig, context)
        )
    except yaml.MarkedYAMLError as err:
        line = f" at line {err.problem_mark.line + 1}" if err.problem_mark else ""
        raise ClusterError(
            f"kubeconfig {where}: invalid YAML{line}: {err.problem or one_line(err)}"
        ) from err
    except (ConfigException, yaml.YAMLError, OSError) as err:
        raise ClusterError(f"kubeconfig {where}: {one_line(err)}") from err
    except (TypeError, AttributeError, KeyError, ValueError) as err:
        # The client indexes the file's YAML as it finds it: a list or a string where a
        # mapping belongs fails as a lookup, which says nothing of the file.
        raise ClusterError(f"kubeconfig {where}: not a kubeconfig ({one_line(err)})") from err
