"""Training signals on the local cluster: what a job that does not crash still tells the operator.

Each drill runs real trainer processes with a real injected fault and checks what the operator
made of it: a non-finite loss rolled back past its data window (or failed with advice once the
rollbacks are spent), a slow input pipeline and a straggling worker shown as conditions while
training goes on, a leak warned of before its OOM kill, and the SDK's example loop (a user's
own JAX loop, not the reference trainer) reporting progress, saving on SIGTERM and failing with
a diagnosis.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests.e2e.conftest import ROOT, LocalCluster, wait_for
from tests.e2e.operator_fixture import OperatorProcess
from tests.e2e.test_operator_recovery import Run, timeline_kinds, training_job

from tpujob.api import GROUP, PLURAL, VERSION, parse_job
from tpujob.plan.manifests import AttemptSettings, trainer_pod

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.trainer,
    pytest.mark.usefixtures("operator", "healthy_nodes"),
]
NAN_STEP = 120
NAN_ADVICE_WORDS = ("learning rate", "warmup", "loss scaling", "clip")
# A user's own JAX loop under the SDK, run as a user would run it: the cluster's Python
# interpreter on the script.
SDK_EXAMPLE = ROOT / "trainer_image" / "examples" / "sdk_loop.py"


def sdk_job(
    name: str,
    checkpoints: Path,
    *,
    steps: int,
    step_time: float,
    faults: tuple[str, ...] = (),
    health_every: int | None = None,
    memory: str | None = None,
    **recovery: Any,
) -> dict[str, Any]:
    """A job whose trainer is the SDK example loop instead of the reference trainer."""
    body = training_job(name, checkpoints, steps=steps, **recovery)
    args = ["--steps", str(steps), "--step-time", str(step_time)]
    for fault in faults:
        args += ["--fault", fault]
    if health_every is not None:
        args += ["--health-every", str(health_every)]
    body["spec"]["trainer"].update(command=["python", str(SDK_EXAMPLE)], args=args)
    if memory is not None:
        body["spec"]["trainer"]["resources"] = {"memory": memory}
    return body


@pytest.fixture(autouse=True)
def jobs_gone(cluster: LocalCluster, namespace: str) -> Iterator[None]:
    """Delete the test's jobs and wait for their pods to go, so the next test finds the TPU
    pools free (a namespace being deleted takes its pods down only slowly)."""
    yield
    api = cluster.api_client()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    for job in custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, job["metadata"]["name"]
        )
    wait_for(
        lambda: not core.list_namespaced_pod(namespace).items,
        timeout=120,
        what=f"the pods of {namespace} gone",
    )


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def condition_true(kind: str) -> Any:
    def check(status: dict[str, Any]) -> bool:
        found = condition(status, kind)
        return found is not None and found["status"] == "True"

    return check


def pod_env(run: Run, attempt: int) -> dict[str, str]:
    pod = run.pods(attempt)[0]
    return {e.name: e.value for e in pod.spec.containers[0].env if e.value is not None}


def test_nan_rolls_back_past_its_window_and_the_job_succeeds(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    steps = NAN_STEP + 30
    run = Run(
        cluster,
        namespace,
        operator,
        training_job(
            "nan",
            tmp_path,
            steps=steps,
            step_time=0.02,
            faults=(f"nan@{NAN_STEP}:attempt=1",),
            maxNanRollbacks=2,
        ),
    )
    status = run.wait_phase("Succeeded")
    assert (status["attempt"], status["nanRollbacks"]) == (2, 1), status.get("lastFailure")
    failure = status["lastFailure"]
    assert failure["code"] == "NAN_LOSS", failure
    assert f"step {NAN_STEP}" in failure["summary"], failure
    # The restore point is the newest checkpoint committed before the NaN (saved every 10
    # steps, asynchronously, so one save may still have been in flight), and the skipped
    # window runs from it up to the step that went NaN.
    resume = status["currentAttempt"]["rollbackStep"]
    assert resume % 10 == 0 and NAN_STEP - 20 <= resume < NAN_STEP, status["currentAttempt"]
    assert status["skipBatches"] == f"{resume}:{NAN_STEP - resume}"
    said = f"rolled back to step {resume}, skipping {NAN_STEP - resume} batches"
    assert said in failure["action"], failure
    restarting = [e["message"] for e in status["timeline"] if e["kind"] == "Restarting"]
    assert len(restarting) == 1 and said in restarting[0], status["timeline"]
    run.told(lambda m: said in m)
    # The second attempt was told where to resume and what to skip, and did so.
    env = pod_env(run, 2)
    assert (env["TPUJOB_RESUME_STEP"], env["TPUJOB_SKIP_BATCHES"]) == (
        str(resume),
        f"{resume}:{NAN_STEP - resume}",
    )
    log = run.core.read_namespaced_pod_log("nan-2-0-0", namespace)
    assert f"resumed from step {resume}" in log, log[-2000:]
    assert (status["progress"]["step"], status["checkpointStep"]) == (steps, steps)
    assert status["restarts"]["total"] == 1
    assert "Resumed" in timeline_kinds(status)


def test_nan_at_every_attempt_fails_with_advice_after_the_allowed_rollbacks(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    allowed = 2
    run = Run(
        cluster,
        namespace,
        operator,
        training_job(
            "nanfatal",
            tmp_path,
            steps=60,
            step_time=0.02,
            faults=("nan@30",),
            maxNanRollbacks=allowed,
        ),
    )
    status = run.wait_phase("Failed")
    assert (status["attempt"], status["nanRollbacks"]) == (allowed + 1, allowed), status.get(
        "timeline"
    )
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "NonFiniteLossRepeated", failed
    message = failed["message"]
    assert f"maxNanRollbacks={allowed}" in message, message
    for word in NAN_ADVICE_WORDS:
        assert word in message, f"{word!r} missing from {message!r}"
    assert status["lastFailure"]["code"] == "NAN_LOSS"
    # Each rollback skipped one more window; the job failed without a third.
    windows = status["skipBatches"].split(",")
    assert len(windows) == allowed, status["skipBatches"]
    assert all(re.fullmatch(r"\d+:\d+", w) for w in windows), windows
    restarting = [e["message"] for e in status["timeline"] if e["kind"] == "Restarting"]
    assert [f"rollback {n} of {allowed}" in m for n, m in enumerate(restarting, 1)] == [
        True
    ] * allowed, restarting
    run.told(lambda m: f"maxNanRollbacks={allowed}" in m)


def test_slow_input_and_a_straggling_worker_show_as_conditions_while_training_goes_on(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Every batch waits 0.2 s more, and worker 1 spends 0.2 s more on its host per step."""
    steps = 100
    run = Run(
        cluster,
        namespace,
        operator,
        sdk_job(
            "signals",
            tmp_path,
            steps=steps,
            step_time=0.02,
            health_every=5,
            faults=("slow-input@1", "straggle@1:worker=1"),
        ),
    )
    both = run.wait(
        lambda s: condition_true("InputBound")(s) and condition_true("Straggler")(s),
        "InputBound and Straggler",
    )
    # Shown while the job trains, on its first attempt.
    assert (both["phase"], both["attempt"]) == ("Running", 1), both
    assert both["progress"]["step"] < steps
    input_bound = condition(both, "InputBound")
    assert input_bound is not None and input_bound["reason"] == "DataWaitHigh"
    fraction = re.search(r"waits for input (\d+)% of its step time", input_bound["message"])
    assert fraction is not None and int(fraction.group(1)) > 25, input_bound["message"]
    assert "prefetch" in input_bound["message"]
    straggler = condition(both, "Straggler")
    assert straggler is not None and straggler["reason"] == "WorkerSlow"
    node = run.node_of(1, 0, 1)
    assert f"worker 1 (pod signals-1-0-1 on node {node})" in straggler["message"], straggler[
        "message"
    ]
    assert run.node_of(1, 0, 0) not in straggler["message"]
    status = run.wait_phase("Succeeded")
    assert (status["attempt"], status["restarts"]["total"]) == (1, 0), status.get("lastFailure")
    assert status["progress"]["step"] == steps
    kinds = timeline_kinds(status)
    assert "InputBound" in kinds and "Straggler" in kinds, kinds
    reasons = {
        e.reason
        for e in run.core.list_namespaced_event(namespace).items
        if e.involved_object.name == "signals"
    }
    assert {"InputBound", "Straggler"} <= reasons, reasons


@pytest.mark.long
def test_a_leak_is_warned_of_with_the_time_left_then_its_oom_kill_is_graded_as_the_leak(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """Worker 1 keeps 16 MiB more per 2-second step (8 MiB/s) in attempt 1; its pod may have
    1536 MiB. The warning comes first, and training goes on under it; then the kernel kills the
    worker at the limit, near step 75, and the kill is graded as the leak the warning
    predicted. 100 steps leave the next attempt, which does not leak, a short finish."""
    body = sdk_job(
        "oomleak",
        tmp_path,
        steps=100,
        step_time=2.0,
        health_every=2,
        memory="1536Mi",
        faults=("leak@1:worker=1:attempt=1",),
    )
    # Checked on the pod the operator would create before the job runs, so a manifest without
    # the limit fails here at once instead of after minutes of training that could never OOM.
    pod = trainer_pod(
        parse_job({**body, "metadata": {"name": "oomleak", "namespace": namespace}}),
        AttemptSettings(attempt=1, pools={0: "tpu-pool-0"}),
        0,
        0,
    )
    limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
    assert limits.get("memory") == "1536Mi", f"the trainer container's limits: {limits}"
    run = Run(cluster, namespace, operator, body)
    # The operator samples the largest worker's memory at most every 30 s and needs four
    # samples of steady growth before it projects a leak this fast.
    status = run.wait(condition_true("HostMemoryGrowing"), "HostMemoryGrowing", timeout=300)
    assert (status["phase"], status["attempt"]) == ("Running", 1), status
    warned = condition(status, "HostMemoryGrowing")
    assert warned is not None and warned["reason"] == "GrowingTowardsLimit", warned
    rate = re.search(r"grows ([0-9.]+) MiB/min", warned["message"])
    assert rate is not None and 200 < float(rate.group(1)) < 700, warned["message"]
    left = re.search(r"reaches the limit of 1536 MiB in about (\d+) min", warned["message"])
    assert left is not None and int(left.group(1)) < 10, warned["message"]
    samples = status["currentAttempt"]["memorySamples"]
    assert len(samples) >= 4
    assert [s["rssBytes"] for s in samples] == sorted(s["rssBytes"] for s in samples)
    assert "HostMemoryGrowing" in timeline_kinds(status)
    status = run.wait(
        lambda s: (s.get("lastFailure") or {}).get("code") == "HOST_OOM",
        "the OOM kill diagnosed",
        timeout=300,
    )
    failure = status["lastFailure"]
    assert "leak" in failure["summary"], failure
    assert any("predicted:" in e for e in failure["evidence"]), failure
    # A warning, not a failure: the only restart is the kill's.
    final = run.wait_phase("Succeeded")
    assert (final["restarts"]["total"], final["restarts"]["medium"]) == (1, 1), final


def test_the_sdk_example_loop_reports_progress_saves_on_sigterm_and_has_failures_diagnosed(
    cluster: LocalCluster, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    """A user's own loop: its heartbeat is the job's progress, a maintenance SIGTERM makes it
    save the step it reached, and a real MemoryError in it is diagnosed as a host OOM."""
    steps = 300
    oom_step = steps - 40
    run = Run(
        cluster,
        namespace,
        operator,
        sdk_job(
            "sdk",
            tmp_path,
            steps=steps,
            step_time=0.05,
            faults=(f"oom@{oom_step}:worker=1:attempt=2",),
        ),
    )
    before = run.wait_training(step=20)
    progress = before["progress"]
    assert progress["totalSteps"] == steps and (progress.get("stepsPerSecond") or 0) > 0, progress
    coordination = client.CoordinationV1Api(cluster.api_client())
    lease = coordination.read_namespaced_lease("sdk-heartbeat", namespace)
    assert int(lease.metadata.annotations["tpujob.dev/step"]) >= 20
    cluster.tpujob("local", "fault", "maintenance", run.node_of(1, 0, 0))
    status = run.wait_phase("Succeeded")
    assert status["attempt"] == 3, status.get("timeline")
    # Attempt 1 stopped on SIGTERM after saving the step it reached; attempt 2 resumed there.
    old_log = cluster.tpujob("local", "logs", "sdk-1-0-0", "-n", namespace).stdout
    saved = [int(m) for m in re.findall(r"saving step (\d+)", old_log)]
    assert saved and saved[-1] >= 20, old_log[-2000:]
    assert "received signal 15" in old_log, old_log[-2000:]
    resumed = re.search(
        r"resumed from step (\d+)",
        cluster.tpujob("local", "logs", "sdk-2-0-0", "-n", namespace).stdout,
    )
    assert resumed is not None and int(resumed.group(1)) == saved[-1]
    diagnosed = [e["message"] for e in status["timeline"] if e["kind"] == "Diagnosed"]
    assert len(diagnosed) == 2, status["timeline"]
    assert "MAINTENANCE" in diagnosed[0], diagnosed
    # Attempt 2's worker 1 raised a real MemoryError at its step: the contract's host OOM.
    failure = status["lastFailure"]
    assert (failure["code"], failure["class"], failure["pod"]) == (
        "HOST_OOM",
        "medium",
        "sdk-2-0-1",
    ), failure
    assert "HOST_OOM" in diagnosed[1] and "[MEDIUM]" in diagnosed[1], diagnosed
    assert status["restarts"]["soft"] + status["restarts"]["medium"] == 2, status["restarts"]
    assert (status["progress"]["step"], status["checkpointStep"]) == (steps, steps)
