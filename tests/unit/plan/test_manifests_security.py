"""Trainer pods pass Pod Security `restricted` unless the job relaxes them, and host paths are
allowed only under the configured prefixes.

The apiserver's own Pod Security admission judges the same manifests in
tests/e2e/test_pod_security.py; here the rules of the `restricted` profile are written out so a
regression names the field that broke.
"""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.builders import at, job_body, observed, running_status

from tpujob.api import ConditionStatus, ConditionType, InvalidJobError, Phase, parse_job
from tpujob.plan import manifests, plan, pod_security
from tpujob.plan.result import PlannerSettings

# The volume types Pod Security `restricted` allows (pod-security-admission, restrictedVolumes).
RESTRICTED_VOLUME_TYPES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The `restricted` checks of pod-security-admission that a trainer pod could fail."""
    spec = pod["spec"]
    pod_ctx = spec.get("securityContext") or {}
    found = []
    for container in spec["containers"]:
        ctx = container.get("securityContext") or {}
        name = container["name"]
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation != false")
        caps = ctx.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"{name}: capabilities do not drop ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: adds capabilities {caps['add']}")
        if ctx.get("privileged"):
            found.append(f"{name}: privileged")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            found.append(f"{name}: runAsNonRoot not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (ctx.get("seccompProfile") or pod_ctx.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccomp {seccomp}")
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUME_TYPES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        found.append("host namespaces")
    return found


def pod_of(**spec: Any) -> dict[str, Any]:
    job = parse_job(job_body(**spec))
    return manifests.trainer_pod(job, manifests.AttemptSettings(attempt=1, pools={}), 0, 0)


def trainer(security: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"image": "trainer:1", "command": ["tpujob-trainer"]}
    if security is not None:
        body["security"] = security
    return body


def test_default_trainer_pod_passes_restricted() -> None:
    assert restricted_violations(pod_of()) == []


def test_default_trainer_pod_runs_as_the_reference_image_user_on_a_read_only_root() -> None:
    pod = pod_of()
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_scratch_is_an_empty_dir_at_tmp_beside_the_checkpoint_claim() -> None:
    pod = pod_of(checkpoint={"volume": {"claimName": "ckpt", "mountPath": "/ckpt"}})
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts == {"/tmp": "tmp", "/var/run/tpujob": "tpujob-rejoin", "/ckpt": "checkpoints"}
    assert "emptyDir" in volumes["tmp"]
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt"}
    assert restricted_violations(pod) == []


@pytest.mark.parametrize(
    ("security", "violation"),
    [
        ({"allowRoot": True, "runAsUser": 0}, "runAsNonRoot not true"),
        ({"addCapabilities": ["IPC_LOCK"]}, "adds capabilities ['IPC_LOCK']"),
        ({"seccompProfile": "Unconfined"}, "seccomp Unconfined"),
    ],
    ids=["root", "capability", "unconfined"],
)
def test_relaxing_security_is_carried_to_the_pod_for_the_namespace_to_judge(
    security: dict[str, Any], violation: str
) -> None:
    pod = pod_of(trainer=trainer(security))
    assert [v for v in restricted_violations(pod) if violation in v]


def test_a_writable_root_filesystem_is_still_restricted() -> None:
    pod = pod_of(trainer=trainer({"readOnlyRootFilesystem": False}))
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert restricted_violations(pod) == []


def test_a_host_path_volume_is_not_restricted() -> None:
    pod = pod_of(checkpoint={"volume": {"hostPath": "/var/tmp/ckpt"}})
    assert restricted_violations(pod) == ["volume checkpoints: ['hostPath']"]


@pytest.mark.parametrize(
    ("security", "message"),
    [
        ({"runAsUser": 0}, "set allowRoot"),
        ({"addCapabilities": ["cap_sys_admin"]}, "addCapabilities"),
        ({"seccompProfile": "Localhost"}, "seccompProfile"),
    ],
    ids=["root-without-allow-root", "lower-case-capability", "localhost-seccomp"],
)
def test_security_the_api_refuses(security: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidJobError, match=message):
        parse_job(job_body(trainer=trainer(security)))


def test_checkpoints_cannot_take_the_scratch_mount() -> None:
    with pytest.raises(InvalidJobError, match="scratch"):
        parse_job(job_body(checkpoint={"volume": {"claimName": "c", "mountPath": "/tmp"}}))


# (path, prefixes, allowed): shared with the chart's ValidatingAdmissionPolicy test.
HOSTPATH_CASES = [
    ("/var/tmp/tpujob/job-a", ["/var/tmp/tpujob"], True),
    ("/var/tmp/tpujob", ["/var/tmp/tpujob"], True),
    ("/var/tmp/tpujob/", ["/var/tmp/tpujob/"], True),
    ("/var/tmp/tpujobs", ["/var/tmp/tpujob"], False),
    ("/var/tmp/tpujob/../../etc", ["/var/tmp/tpujob"], False),
    ("/var/tmp/tpujob/..", ["/var/tmp/tpujob"], False),
    ("/", ["/var/tmp/tpujob"], False),
    ("/etc", [], False),
    ("/data/a", ["/scratch", "/data"], True),
    ("/anything", ["/"], True),
    ("relative/path", ["/"], False),
    ("/data/a", ["data"], False),
]


@pytest.mark.parametrize(
    ("path", "prefixes", "allowed"),
    HOSTPATH_CASES,
    ids=[f"{p}-under-{','.join(x)}" for p, x, _ in HOSTPATH_CASES],
)
def test_host_path_is_allowed_only_under_a_configured_prefix(
    path: str, prefixes: list[str], allowed: bool
) -> None:
    assert pod_security.hostpath_allowed(path, prefixes) is allowed


def test_the_trainers_memory_is_its_request_and_its_limit() -> None:
    pod = pod_of(trainer={**trainer(), "resources": {"cpu": "2", "memory": "3Gi"}})
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "2", "memory": "3Gi"}
    assert resources["limits"]["memory"] == "3Gi"
    assert "cpu" not in resources["limits"]  # a CPU limit throttles the input pipeline


@pytest.mark.parametrize("slices", [1, 2])
def test_every_jobs_pods_get_the_rejoin_order_file(slices: int) -> None:
    from tpujob.api import contract

    pod = pod_of(slices=slices)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env.get(contract.ENV_REJOIN_FILE) == "/var/run/tpujob/rejoin"
    item = volumes["tpujob-rejoin"]["downwardAPI"]["items"][0]
    assert item["fieldRef"]["fieldPath"] == "metadata.annotations['tpujob.dev/rejoin']"
    assert mounts["tpujob-rejoin"]["readOnly"] is True
    assert mounts["tpujob-rejoin"]["mountPath"] == "/var/run/tpujob"
    assert restricted_violations(pod) == []


@pytest.mark.parametrize(
    ("prefixes", "attempt", "launched"),
    [
        (None, 0, True),  # no list given: left to the cluster's admission
        (("/var/tmp/ckpt",), 0, True),
        (("/data",), 0, False),
        ((), 0, False),  # the chart's default: no node path
        (("/data",), 1, True),  # already running: narrowed prefixes do not stop it
    ],
)
def test_the_operator_refuses_to_launch_a_host_path_outside_its_prefixes(
    prefixes: tuple[str, ...] | None, attempt: int, launched: bool
) -> None:
    status = running_status(attempt=attempt) if attempt else {}
    job = job_body(
        status=status,
        checkpoint={"volume": {"hostPath": "/var/tmp/ckpt/run", "mountPath": "/checkpoints"}},
    )
    settings = PlannerSettings(host_path_prefixes=prefixes)
    result = plan(observed(job), now=at(0), settings=settings)
    valid = result.status.condition(ConditionType.SPEC_VALID)
    assert valid is not None
    assert (valid.status == ConditionStatus.TRUE) is launched
    if not launched:
        assert result.create == ()
        assert result.status.phase is Phase.PENDING
        assert "spec.checkpoint.volume.hostPath: /var/tmp/ckpt/run" in (valid.message or "")
