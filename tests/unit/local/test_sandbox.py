"""How a pod's container becomes a local process: env, downward API, command, mounts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpujob.local.agent import claims, sandbox

POD: dict[str, Any] = {
    "metadata": {
        "name": "job-s0-w1",
        "namespace": "team",
        "uid": "u-1",
        "labels": {"tpujob.dev/slice": "0"},
        "annotations": {"a": "b"},
    },
    "spec": {
        "nodeName": "tpu-pool-0-w1",
        "serviceAccountName": "trainer",
        "hostname": "w1",
        "subdomain": "job",
    },
}


class FakeLookups:
    """Lookups backed by dicts; the real one is exercised by the cluster tests."""

    def __init__(self) -> None:
        self.maps = {"settings": {"LR": "0.1"}}

    def config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.maps.get(name)

    def secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    def token(
        self,
        namespace: str,
        service_account: str,
        *,
        pod: str,
        pod_uid: str,
        audiences: list[str],
        seconds: int,
    ) -> str:
        return f"token-for-{namespace}/{service_account}/{pod}"

    def ca_cert(self) -> str:
        return "CA"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("metadata.name", "job-s0-w1"),
        ("metadata.namespace", "team"),
        ("spec.nodeName", "tpu-pool-0-w1"),
        ("status.podIP", "10.1.1.1"),
        ("metadata.labels['tpujob.dev/slice']", "0"),
        ("metadata.annotations['a']", "b"),
        ("spec.serviceAccountName", "trainer"),
    ],
    ids=str,
)
def test_field_refs_resolve_like_the_downward_api(path: str, expected: str) -> None:
    assert sandbox.field_value(POD, path, "10.1.1.1") == expected


def test_unknown_field_ref_is_a_start_error() -> None:
    with pytest.raises(sandbox.StartError, match="unsupported fieldRef"):
        sandbox.field_value(POD, "spec.nope", "10.1.1.1")


def test_container_env_has_service_env_values_and_refs() -> None:
    container = {
        "env": [
            {"name": "A", "value": "1"},
            {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "LR", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "LR"}}},
        ],
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
    }
    env = sandbox.container_env(
        POD,
        container,
        pod_ip="10.1.1.1",
        api=sandbox.ApiEndpoint("10.1.0.1", 443),
        lookups=FakeLookups(),
    )
    assert env["KUBERNETES_SERVICE_HOST"] == "10.1.0.1"
    assert env["KUBERNETES_SERVICE_PORT"] == "443"
    assert (env["A"], env["ME"], env["LR"], env["CFG_LR"]) == ("1", "job-s0-w1", "0.1", "0.1")
    assert env["HOSTNAME"] == "w1"


def test_missing_config_map_key_is_a_start_error() -> None:
    container = {
        "env": [
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "missing"}}}
        ]
    }
    with pytest.raises(sandbox.StartError, match="missing"):
        sandbox.container_env(
            POD, container, pod_ip="", api=sandbox.ApiEndpoint("h", 1), lookups=FakeLookups()
        )


def test_command_is_found_on_the_container_path() -> None:
    argv = sandbox.resolve_command(
        {"command": ["sh"], "args": ["-c", "true"]}, {"PATH": "/usr/bin:/bin"}
    )
    assert Path(argv[0]).name == "sh"
    assert argv[1:] == ["-c", "true"]


@pytest.mark.parametrize(
    ("container", "message"),
    [
        (
            {"command": ["no-such-binary-xyz"]},
            'exec: "no-such-binary-xyz": executable file not found',
        ),
        ({}, "no command"),
    ],
    ids=["not-on-path", "no-command"],
)
def test_unstartable_commands_are_start_errors(container: dict[str, Any], message: str) -> None:
    with pytest.raises(sandbox.StartError, match=message):
        sandbox.resolve_command(container, {"PATH": "/usr/bin:/bin"})


def test_projected_service_account_volume_holds_token_ca_and_namespace(tmp_path: Path) -> None:
    pod = {
        **POD,
        "spec": {
            **POD["spec"],
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ]
                    },
                }
            ],
        },
    }
    paths = sandbox.prepare_volumes(pod, tmp_path, pod_ip="10.1.1.1", lookups=FakeLookups())
    folder = paths["kube-api-access"]
    assert (folder / "token").read_text() == "token-for-team/trainer/job-s0-w1"
    assert (folder / "ca.crt").read_text() == "CA"
    assert (folder / "namespace").read_text() == "team"


def test_downward_api_files_follow_the_pods_annotations_as_they_change(tmp_path: Path) -> None:
    volume = {
        "name": "order",
        "downwardAPI": {
            "items": [
                {
                    "path": "rejoin",
                    "fieldRef": {"fieldPath": "metadata.annotations['tpujob.dev/rejoin']"},
                }
            ]
        },
    }
    pod = {**POD, "spec": {**POD["spec"], "volumes": [volume]}}
    paths = sandbox.prepare_volumes(pod, tmp_path, pod_ip="10.1.1.1", lookups=FakeLookups())
    file = paths["order"] / "rejoin"
    assert file.read_text() == ""
    assert sandbox.refresh_downward_volumes(pod, tmp_path, pod_ip="10.1.1.1") == 0
    moved = {**pod, "metadata": {**POD["metadata"], "annotations": {"tpujob.dev/rejoin": "2"}}}
    assert sandbox.refresh_downward_volumes(moved, tmp_path, pod_ip="10.1.1.1") == 1
    assert file.read_text() == "2"
    assert sandbox.refresh_downward_volumes(moved, tmp_path, pod_ip="10.1.1.1") == 0


def test_bwrap_argv_enters_the_pod_namespaces_and_binds_its_paths(tmp_path: Path) -> None:
    argv = sandbox.bwrap_argv(
        netns="tpj-x",
        hostname="w1",
        hosts_file=tmp_path / "hosts",
        tmp_dir=tmp_path / "tmp",
        termination_file=tmp_path / "term",
        termination_path="/dev/termination-log",
        mounts=[
            sandbox.Mount(tmp_path / "ckpt", "/ckpt"),
            sandbox.Mount(tmp_path / "sa", sandbox.SERVICE_ACCOUNT_DIR, read_only=True),
        ],
        working_dir="/work",
        argv=["python", "-m", "x"],
        root_entries=[sandbox.RootEntry("usr"), sandbox.RootEntry("bin", "usr/bin")],
    )
    assert argv[:5] == ["ip", "netns", "exec", "tpj-x", "bwrap"]
    joined = " ".join(argv)
    assert f"--bind {tmp_path / 'ckpt'} /ckpt" in joined
    assert f"--ro-bind {tmp_path / 'hosts'} /etc/hosts" in joined
    assert f"--bind {tmp_path / 'term'} /dev/termination-log" in joined
    account_dir = sandbox.resolve_target(sandbox.SERVICE_ACCOUNT_DIR)
    assert f"--ro-bind {tmp_path / 'sa'} {account_dir}" in joined
    assert "--ro-bind /usr /usr" in joined
    assert "--symlink usr/bin /bin" in joined
    assert "--tmpfs /run" in joined
    assert argv[argv.index("--") + 1 :] == ["python", "-m", "x"]


def test_mount_targets_under_host_symlinks_resolve_inside_the_sandbox(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    target = str(tmp_path / "link" / "secrets" / "token")
    assert sandbox.resolve_target(target) == str(tmp_path / "real" / "secrets" / "token")
    assert sandbox.resolve_target("/checkpoints") == "/checkpoints"


def test_an_environment_kept_under_tmp_is_bound_into_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pods get a private /tmp; the environment their commands come from must still be there.
    venv, sources = tmp_path / "venv", tmp_path / "venv" / "lib"
    sources.mkdir(parents=True)
    monkeypatch.setattr(sandbox.sys, "prefix", str(venv))
    monkeypatch.setattr(sandbox.sys, "path", [str(sources), "/usr/lib/python3"])
    binds = sandbox.own_paths_under_tmp()
    assert [(m.source, m.target, m.read_only) for m in binds] == [(venv, str(venv), True)]


def sandbox_argv(tmp_path: Path, mounts: list[sandbox.Mount]) -> list[str]:
    return sandbox.bwrap_argv(
        netns="tpj-x",
        hostname="w1",
        hosts_file=tmp_path / "hosts",
        tmp_dir=tmp_path / "tmp",
        termination_file=tmp_path / "term",
        termination_path="/dev/termination-log",
        mounts=mounts,
        working_dir=None,
        argv=["trainer"],
        root_entries=[
            sandbox.RootEntry("usr"),
            sandbox.RootEntry("etc"),
            sandbox.RootEntry("home"),
        ],
    )


def writable_targets(argv: list[str]) -> set[str]:
    """Every path the sandboxed process can write on the host (read-write binds)."""
    options = argv[: argv.index("--")]
    return {options[i + 2] for i, arg in enumerate(options) if arg == "--bind"}


def test_host_directories_are_read_only_except_what_the_pod_mounts(tmp_path: Path) -> None:
    argv = sandbox_argv(
        tmp_path,
        [
            sandbox.Mount(tmp_path / "ckpt", "/checkpoints"),
            sandbox.Mount(tmp_path / "cfg", "/config", read_only=True),
        ],
    )
    assert writable_targets(argv) == {"/tmp", "/dev/termination-log", "/checkpoints"}
    joined = " ".join(argv)
    for entry in ("usr", "etc", "home"):
        assert f"--ro-bind /{entry} /{entry}" in joined


def test_the_sandbox_drops_capabilities_gets_a_session_and_dies_with_the_agent(
    tmp_path: Path,
) -> None:
    options = sandbox_argv(tmp_path, [])
    options = options[: options.index("--")]
    assert options[options.index("--cap-drop") + 1] == "ALL"
    assert "--new-session" in options
    assert "--die-with-parent" in options


@pytest.mark.parametrize(
    ("volume", "mount", "read_only"),
    [({}, {}, False), ({"readOnly": True}, {}, True), ({}, {"readOnly": True}, True)],
    ids=["writable", "claim-read-only", "mount-read-only"],
)
def test_claim_mounts_follow_read_only_on_the_volume_or_the_mount(
    tmp_path: Path, volume: dict[str, Any], mount: dict[str, Any], read_only: bool
) -> None:
    pod = {
        **POD,
        "spec": {
            **POD["spec"],
            "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "c", **volume}}],
        },
    }
    container = {"volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt", **mount}]}
    [found] = sandbox.container_mounts(pod, container, {"ckpt": tmp_path})
    assert (found.source, found.target, found.read_only) == (tmp_path, "/ckpt", read_only)


def test_a_sub_path_cannot_climb_out_of_its_volume(tmp_path: Path) -> None:
    pod = {**POD, "spec": {**POD["spec"], "volumes": [{"name": "v", "emptyDir": {}}]}}
    container = {"volumeMounts": [{"name": "v", "mountPath": "/x", "subPath": "../../etc"}]}
    with pytest.raises(sandbox.StartError, match="subPath"):
        sandbox.container_mounts(pod, container, {"v": tmp_path})


class FakeClaims:
    """Claims and volumes as the API would return them after the PV controller bound them."""

    def __init__(self, pv_path: Path) -> None:
        self.claims = {
            ("team", "ckpt"): {
                "metadata": {"name": "ckpt", "namespace": "team", "uid": "claim-uid"},
                "spec": {"volumeName": "pv-1"},
                "status": {"phase": "Bound"},
            }
        }
        self.volumes = {
            "pv-1": {
                "spec": {
                    "hostPath": {"path": str(pv_path)},
                    "claimRef": {"namespace": "team", "name": "ckpt", "uid": "claim-uid"},
                }
            }
        }

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.claims.get((namespace, name))

    def volume(self, name: str) -> dict[str, Any] | None:
        return self.volumes.get(name)


def test_a_bound_claim_mounts_its_volume_directory(tmp_path: Path) -> None:
    pod = {
        **POD,
        "spec": {
            **POD["spec"],
            "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
        },
    }
    lookups = FakeClaims(tmp_path)
    paths = sandbox.prepare_volumes(
        pod,
        tmp_path / "pod",
        pod_ip="10.1.1.1",
        lookups=FakeLookups(),
        claim_path=lambda ns, name: claims.claim_path(ns, name, lookups),
    )
    assert paths == {"ckpt": tmp_path}


def _unbound(c: FakeClaims) -> None:
    c.claims["team", "ckpt"]["status"] = {"phase": "Pending"}


def _claimed_by_another(c: FakeClaims) -> None:
    c.volumes["pv-1"]["spec"]["claimRef"]["uid"] = "other-uid"


def _nfs(c: FakeClaims) -> None:
    c.volumes["pv-1"]["spec"] = {
        "nfs": {"server": "x", "path": "/"},
        "claimRef": c.volumes["pv-1"]["spec"]["claimRef"],
    }


def _missing(c: FakeClaims) -> None:
    c.claims.clear()


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (_missing, "not found"),
        (_unbound, "not bound"),
        (_claimed_by_another, "is not bound to claim"),
        (_nfs, "only hostPath and local"),
    ],
    ids=["missing", "pending", "volume-bound-elsewhere", "unsupported-source"],
)
def test_a_claim_that_is_not_bound_to_a_local_volume_does_not_mount(
    tmp_path: Path, spoil: Any, message: str
) -> None:
    lookups = FakeClaims(tmp_path)
    spoil(lookups)
    with pytest.raises(claims.ClaimError, match=message):
        claims.claim_path("team", "ckpt", lookups)


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("--bind=$(POD_IP)", "--bind=10.1.2.3"),
        ("$(POD_IP):$(PORT)", "10.1.2.3:80"),
        ("$(UNSET)", "$(UNSET)"),  # an unknown name stays as written
        ("$$(POD_IP)", "$(POD_IP)"),  # $$ escapes
        ("cost $$5", "cost $5"),
        ("$(POD_IP", "$(POD_IP"),  # unterminated
        ("plain", "plain"),
    ],
    ids=str,
)
def test_command_references_expand_as_the_kubelet_does(text: str, expanded: str) -> None:
    from tpujob.local.agent.sandbox import expand_references

    assert expand_references(text, {"POD_IP": "10.1.2.3", "PORT": "80"}) == expanded


@pytest.mark.parametrize("python_path", ["/src/a:/src/b", None], ids=["set", "unset"])
def test_container_env_carries_the_nodes_python_path_under_the_pods_own_env(
    monkeypatch: pytest.MonkeyPatch, python_path: str | None
) -> None:
    if python_path is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", python_path)
    api, lookups = sandbox.ApiEndpoint("10.1.0.1", 443), FakeLookups()
    env = sandbox.container_env(POD, {}, pod_ip="10.1.1.1", api=api, lookups=lookups)
    assert env.get("PYTHONPATH") == python_path
    own = {"env": [{"name": "PYTHONPATH", "value": "/app"}]}
    env = sandbox.container_env(POD, own, pod_ip="10.1.1.1", api=api, lookups=lookups)
    assert env["PYTHONPATH"] == "/app"
