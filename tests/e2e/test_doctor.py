"""`tpujob doctor` on the local cluster, before and after the CRDs and the operator exist."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.e2e.conftest import CHART, LocalCluster, wait_for, wait_host_paths_admitted
from tests.e2e.test_chart_install import helm

pytestmark = [pytest.mark.cluster]


def doctor(cluster: LocalCluster) -> tuple[int, list[dict[str, Any]]]:
    proc = cluster.tpujob("doctor", "--json", check=False)
    return proc.returncode, json.loads(proc.stdout)


def by_check(findings: list[dict[str, Any]], check: str) -> list[dict[str, Any]]:
    return [f for f in findings if f["check"] == check]


def test_doctor_before_and_after_install(cluster: LocalCluster) -> None:
    # Other tests of the session may have applied the CRDs already; deleting them would
    # break those, so the CRD finding is checked only on a fresh cluster.
    crd_present = (
        cluster.kubectl("get", "crd", "tputrainingjobs.tpujob.dev", check=False).returncode == 0
    )
    # An operator another test installed and removed may still be terminating.
    wait_for(
        lambda: (
            not cluster.kubectl(
                "get",
                "pods",
                "-A",
                "-l",
                "app.kubernetes.io/name=tpujob-operator",
                "-o",
                "name",
                check=False,
            ).stdout.strip()
        ),
        timeout=120,
        what="no operator pod left",
    )
    code, findings = doctor(cluster)
    assert code == 1
    assert [f["level"] for f in by_check(findings, "crd")] == (
        ["ok"] if crd_present else ["problem"]
    )
    assert [f["level"] for f in by_check(findings, "operator")] == ["problem"]
    pools = {f["subject"]: f for f in by_check(findings, "node-pools")}
    assert {"tpu-pool-0", "tpu-pool-1", "tpu-pool-2"} <= set(pools)
    assert "2/2 hosts" in pools["tpu-pool-0"]["message"]
    assert all(f["action"] for f in findings if f["level"] == "problem")
    human = cluster.tpujob("doctor", check=False)
    assert human.returncode == 1
    assert "problem(s)" in human.stdout

    helm(
        cluster,
        "install",
        "doctor",
        str(CHART),
        "--namespace",
        "doctor-system",
        "--create-namespace",
        "--wait",
        "--timeout",
        "180s",
    )
    try:

        def healthy() -> list[dict[str, Any]] | None:
            code, found = doctor(cluster)
            return found if code == 0 else None

        findings = wait_for(healthy, timeout=120, what="doctor exits 0", interval=3)
        assert [f["level"] for f in by_check(findings, "crd")] == ["ok"]
        assert [f["level"] for f in by_check(findings, "operator")] == ["ok"]
        assert by_check(findings, "catalogue")[0]["level"] == "info"
    finally:
        helm(cluster, "uninstall", "doctor", "--namespace", "doctor-system", "--wait")
        wait_host_paths_admitted(cluster)
