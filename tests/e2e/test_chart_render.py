"""The chart against a real apiserver: what `helm template` renders is accepted by server-side
dry-run (roles, ValidatingAdmissionPolicies with their CEL, the NetworkPolicy).
tests/e2e/test_rbac.py checks what the rendered roles allow.

The chart's CRDs are applied with the command its README gives for upgrades, so that command is
exercised too.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml
from tests.e2e.conftest import CHART, helm_template

pytestmark = pytest.mark.cluster


def run(
    cluster: Any, tool: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(cluster.bin_dir / tool), "--kubeconfig", str(cluster.kubeconfig), *args]
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, check=False, timeout=120
    )


def kubectl(cluster: Any, *args: str, stdin: str | None = None) -> str:
    result = run(cluster, "kubectl", *args, stdin=stdin)
    assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def chart_crds(cluster: Any, crds_installed: Any) -> None:
    """The chart's CRDs applied the way its README says to upgrade them."""
    kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    kubectl(
        cluster,
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/clusterkopfpeerings.kopf.dev",
        "crd/kopfpeerings.kopf.dev",
        "crd/tputrainingjobs.tpujob.dev",
    )


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param((), id="defaults"),
        pytest.param(("replicas=2",), id="two-replicas"),
        pytest.param(("watchNamespaces={NAMESPACE}",), id="watch-namespaces"),
        pytest.param(
            ("grafanaDashboard.enabled=true", "image.repository=localhost/op", "image.tag=dev"),
            id="dashboard-and-local-image",
        ),
        pytest.param(
            (
                "hostPathPrefixes={/var/tmp/tpujob,/data/}",
                "networkPolicy.enabled=true",
                "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring",
            ),
            id="host-paths-and-network-policy",
        ),
    ],
)
def test_rendered_chart_is_accepted_by_server_side_dry_run(
    cluster: Any, chart_crds: None, namespace: str, sets: tuple[str, ...]
) -> None:
    sets = tuple(s.replace("NAMESPACE", namespace) for s in sets)
    rendered = helm_template(cluster, "tpujob", namespace, *sets)
    objects = [doc for doc in yaml.safe_load_all(rendered) if doc]
    output = kubectl(cluster, "apply", "--dry-run=server", "-f", "-", stdin=rendered)
    accepted = [line for line in output.splitlines() if line.endswith("(server dry run)")]
    assert len(accepted) == len(objects), output
