"""Site knowledge: `tpujob regrade` records a job's failure with the class the cluster's people
give it, and the operator grades the same failure in another job by it, saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client
from tests.e2e.conftest import LocalCluster
from tests.e2e.operator_fixture import OPERATOR_HOME, OperatorProcess
from tests.e2e.test_operator_recovery import Run, training_job

from tpujob.diagnosis.site import SITE_RULES_CONFIGMAP, SITE_RULES_KEY

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]

# A collective timeout on worker 0 at step 30, in the first attempt only: medium, retried.
FAULT = "exit-code=31@30:worker=0:attempt=1"


def test_a_regraded_failure_is_graded_by_the_site_rule_in_another_job(
    cluster: LocalCluster,
    core: client.CoreV1Api,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    first = Run(
        cluster, namespace, operator, training_job("first", tmp_path / "a", faults=(FAULT,))
    )
    seen = first.wait(
        lambda s: bool(s.get("failureHistory")) and s.get("restarts", {}).get("medium") == 1,
        "the first job's failure recorded and retried",
    )
    assert seen["lastFailure"]["code"] == "COLLECTIVE_TIMEOUT"
    done = cluster.tpujob(
        "regrade",
        f"{namespace}/first",
        "--class",
        "fatal",
        "--why",
        "this cluster's fabric never times out: a timeout is the program's deadlock",
        "--name",
        "collective-timeout-is-ours",
        "--operator-namespace",
        OPERATOR_HOME,
    )
    assert "collective-timeout-is-ours" in done.stdout
    stored = core.read_namespaced_config_map(SITE_RULES_CONFIGMAP, OPERATOR_HOME)
    rules = yaml.safe_load(stored.data[SITE_RULES_KEY])["rules"]
    assert [r["signature"] for r in rules if r["name"] == "collective-timeout-is-ours"] == [
        seen["failureHistory"][-1]["signature"]
    ]
    # The same failure in another job: failed at once by the site rule, which is named.
    second = Run(
        cluster, namespace, operator, training_job("second", tmp_path / "b", faults=(FAULT,))
    )
    status = second.wait_phase("Failed")
    assert status["attempt"] == 1
    assert status["lastFailure"]["class"] == "fatal"
    assert "site rule 'collective-timeout-is-ours'" in status["lastFailure"]["summary"]
    second.told(lambda m: "site rule 'collective-timeout-is-ours'" in m)
    # The job it was learnt from keeps training: a regrade teaches, it does not reach back.
    assert first.wait_phase("Succeeded")["restarts"]["medium"] == 1
