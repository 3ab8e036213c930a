"""How a pod's container becomes a local process: env, downward API, command, mounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpujob.local.agent import sandbox

POD: dict[str, Any] = {
    "metadata": {"name": "job-s0-w1", "namespace": "team", "uid": "u-1",
                 "labels": {"tpujob.dev/slice": "0"}, "annotations": {"a": "b"}},
    "spec": {"nodeName": "tpu-pool-0-w1", "serviceAccountName": "trainer", "hostname": "w1",
             "subdomain": "job"},
}


class FakeLookups:
    """Lookups backed by dicts; the real one is exercised by the cluster tests."""

    def __init__(self) -> None:
        self.maps = {"settings": {"LR": "0.1"}}

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.maps.get(name)

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    def token(self, namespace: str, service_account: str, *, pod: str, pod_uid: str,
              audiences: list[str], seconds: int) -> str:
        return f"token-for-{namespace}/{service_account}/{pod}"

    def ca_cert(self) -> str:
        return "CA"


@pytest.mark.parametrize(("path", "expected"), [
    ("metadata.name", "job-s0-w1"),
    ("metadata.namespace", "team"),
    ("spec.nodeName", "tpu-pool-0-w1"),
    ("status.podIP", "10.1.1.1"),
    ("metadata.labels['tpujob.dev/slice']", "0"),
    ("metadata.annotations['a']", "b"),
    ("spec.serviceAccountName", "trainer"),
], ids=str)
def test_field_refs_resolve_like_the_downward_api(path: str, expected: str) -> None:
    assert sandbox.field_value(POD, path, "10.1.1.1") == expected


def test_unknown_field_ref_is_a_start_error() -> None:
    with pytest.raises(sandbox.StartError, match="unsupported fieldRef"):
        sandbox.field_value(POD, "spec.nope", "10.1.1.1")


def test_container_env_has_service_env_values_and_refs() -> None:
    container = {"env": [
        {"name": "A", "value": "1"},
        {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LR"}}},
    ], "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}]}
    env = sandbox.container_env(POD, container, pod_ip="10.1.1.1",
                                api=sandbox.ApiEndpoint("10.1.0.1", 443), lookups=FakeLookups())
    assert env["KUBERNETES_SERVICE_HOST"] == "10.1.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "443"
    assert (env["A"], env["ME"], env["LR"], env["CFG_LR"]) == ("1", "job-s0-w1", "0.1", "0.1")
    assert env["HOSTNAME"] == "w1"


def test_missing_config_map_key_is_a_start_error() -> None:
    container = {"env": [{"name": "X", "valueFrom": {
        "configMapKeyRef": {"name": "settings", "key": "missing"}}}]}
    with pytest.raises(sandbox.StartError, match="missing"):
        sandbox.container_env(POD, container, pod_ip="", api=sandbox.ApiEndpoint("h", 1),
                              lookups=FakeLookups())


def test_command_is_found_on_the_container_path() -> None:
    argv = sandbox.resolve_command({"command": ["sh"], "args": ["-c", "true"]},
                                   {"PATH": "/usr/bin:/bin"})
    assert Path(argv[0]).name == "sh"
    assert argv[1:] == ["-c", "true"]


@pytest.mark.parametrize(("container", "message"), [
    ({"command": ["no-such-binary-xyz"]}, 'exec: "no-such-binary-xyz": executable file not found'),
    ({}, "no command"),
], ids=["not-on-path", "no-command"])
def test_unstartable_commands_are_start_errors(container: dict[str, Any], message: str) -> None:
    with pytest.raises(sandbox.StartError, match=message):
        sandbox.resolve_command(container, {"PATH": "/usr/bin:/bin"})


def test_projected_service_account_volume_holds_token_ca_and_namespace(tmp_path: Path) -> None:
    pod = {**POD, "spec": {**POD["spec"], "volumes": [{"name": "kube-api-access", "projected": {
        "sources": [
            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                                   "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                "fieldPath": "metadata.namespace"}}]}},
        ]}}]}}
    paths = sandbox.prepare_volumes(pod, tmp_path, pod_ip="10.1.1.1", lookups=FakeLookups())
    folder = paths["kube-api-access"]
    assert (folder / "token").read_text() == "token-for-team/trainer/job-s0-w1"
    assert (folder / "ca.crt").read_text() == "CA"
    assert (folder / "namespace").read_text() == "team"


def test_bwrap_argv_enters_the_pod_namespaces_and_binds_its_paths(tmp_path: Path) -> None:
    argv = sandbox.bwrap_argv(
        netns="tpj-x", hostname="w1", hosts_file=tmp_path / "hosts", tmp_dir=tmp_path / "tmp",
        termination_file=tmp_path / "term", termination_path="/dev/termination-log",
        mounts=[sandbox.Mount(tmp_path / "ckpt", "/ckpt"),
                sandbox.Mount(tmp_path / "sa", sandbox.SERVICE_ACCOUNT_DIR, read_only=True)],
        working_dir="/work", argv=["python", "-m", "x"],
        root_entries=[sandbox.RootEntry("usr"), sandbox.RootEntry("bin", "usr/bin")])
    assert argv[:7] == ["ip", "netns", "exec", "tpj-x", "bwrap", "--tmpfs", "/"]
    joined = " ".join(argv)
    assert f"--ro-bind {tmp_path / 'hosts'} /etc/hosts" in joined
    assert f"--bind {tmp_path / 'term'} /dev/termination-log" in joined
    account_dir = sandbox.resolve_target(sandbox.SERVICE_ACCOUNT_DIR)
    assert f"--ro-bind {tmp_path / 'sa'} {account_dir}" in joined
    assert "--bind /usr /usr" in joined
    assert "--symlink usr/bin /bin" in joined
    assert "--tmpfs /run" in joined
    assert argv[argv.index("--") + 1:] == ["python", "-m", "x"]


def test_mount_targets_under_host_symlinks_resolve_inside_the_sandbox(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    target = str(tmp_path / "link" / "secrets" / "token")
    assert sandbox.resolve_target(target) == str(tmp_path / "real" / "secrets" / "token")
    assert sandbox.resolve_target("/checkpoints") == "/checkpoints"


def test_an_environment_kept_under_tmp_is_bound_into_pods(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Pods get a private /tmp; the environment their commands come from must still be there.
    venv, sources = tmp_path / "venv", tmp_path / "venv" / "lib"
    sources.mkdir(parents=True)
    monkeypatch.setattr(sandbox.sys, "prefix", str(venv))
    monkeypatch.setattr(sandbox.sys, "path", [str(sources), "/usr/lib/python3"])
    binds = sandbox.own_paths_under_tmp()
    assert [(m.source, m.target, m.read_only) for m in binds] == [(venv, str(venv), True)]
