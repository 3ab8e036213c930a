"""hostPath volumes on the local node follow the kubelet's hostPath types, for a pod's own
volume and for a claim bound to a hostPath PersistentVolume (docs/kubelet-fidelity.md)."""

from __future__ import annotations

import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from tpujob.local.agent import claims, hostpaths, sandbox


def test_directory_or_create_makes_the_missing_folder_and_its_parents(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    assert hostpaths.prepare(path, "DirectoryOrCreate") == path
    assert path.is_dir()
    assert stat.S_IMODE(path.stat().st_mode) & 0o755 == 0o755


def test_file_or_create_makes_an_empty_file_but_not_its_folder(tmp_path: Path) -> None:
    hostpaths.prepare(tmp_path / "f", "FileOrCreate")
    assert (tmp_path / "f").read_bytes() == b""
    with pytest.raises(hostpaths.HostPathError, match="No such file"):
        hostpaths.prepare(tmp_path / "missing" / "f", "FileOrCreate")


def test_an_untyped_path_that_is_missing_becomes_a_folder(tmp_path: Path) -> None:
    # As the container runtime makes a missing bind-mount source (measured on kind).
    assert hostpaths.prepare(tmp_path / "new", None).is_dir()
    (tmp_path / "file").write_text("x")
    assert hostpaths.prepare(tmp_path / "file", "") == tmp_path / "file"


def _make(tmp_path: Path, what: str) -> Path:
    path = tmp_path / what
    if what == "dir":
        path.mkdir()
    elif what == "file":
        path.write_text("x")
    elif what == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    return path


@pytest.mark.parametrize(
    ("kind", "what", "failure"),
    [
        ("Directory", "missing", "is not a directory"),
        ("Directory", "file", "is not a directory"),
        ("DirectoryOrCreate", "file", "is not a directory"),
        ("File", "missing", "is not a file"),
        ("File", "dir", "is not a file"),
        ("FileOrCreate", "dir", "is not a file"),
        ("Socket", "file", "is not a socket file"),
        ("CharDevice", "file", "is not a character device"),
        ("BlockDevice", "file", "is not a block device"),
    ],
)
def test_type_checks_fail_with_the_kubelets_message(
    tmp_path: Path, kind: str, what: str, failure: str
) -> None:
    path = _make(tmp_path, what)
    with pytest.raises(hostpaths.HostPathError) as err:
        hostpaths.prepare(path, kind)
    assert str(err.value) == f"hostPath type check failed: {path} {failure}"


@pytest.mark.parametrize(
    ("kind", "what"), [("Directory", "dir"), ("File", "file"), ("Socket", "socket")]
)
def test_type_checks_pass_for_what_they_name(tmp_path: Path, kind: str, what: str) -> None:
    path = _make(tmp_path, what)
    assert hostpaths.prepare(path, kind) == path


def test_an_unknown_type_is_refused(tmp_path: Path) -> None:
    with pytest.raises(hostpaths.HostPathError, match="Folder is an invalid volume type"):
        hostpaths.prepare(tmp_path, "Folder")


class OneClaim:
    """A claim `team/ckpt` bound to the PersistentVolume `pv-1` with `source`."""

    def __init__(self, source: dict[str, Any]) -> None:
        self.source = source

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {
            "metadata": {"name": name, "namespace": namespace, "uid": "claim-uid"},
            "spec": {"volumeName": "pv-1"},
            "status": {"phase": "Bound"},
        }

    def volume(self, name: str) -> dict[str, Any] | None:
        ref = {"namespace": "team", "name": "ckpt", "uid": "claim-uid"}
        return {"metadata": {"name": name}, "spec": {**self.source, "claimRef": ref}}


def test_a_claim_on_a_directory_or_create_volume_makes_its_missing_folder(tmp_path: Path) -> None:
    # The node agent used to refuse this with "is not a directory"; the kubelet creates it.
    path = tmp_path / "checkpoints" / "run-1"
    lookups = OneClaim({"hostPath": {"path": str(path), "type": "DirectoryOrCreate"}})
    assert claims.claim_path("team", "ckpt", lookups) == path
    assert path.is_dir()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"hostPath": {"type": "Directory"}}, "hostPath type check failed: .* is not a directory"),
        ({"local": {}}, ".* is not a directory"),
    ],
    ids=["hostPath-Directory", "local"],
)
def test_a_claim_on_a_missing_folder_it_may_not_create_does_not_mount(
    tmp_path: Path, source: dict[str, Any], message: str
) -> None:
    kind = next(iter(source))
    lookups = OneClaim({kind: {**source[kind], "path": str(tmp_path / "missing")}})
    with pytest.raises(claims.ClaimError, match=f'persistentvolume "pv-1": {message}'):
        claims.claim_path("team", "ckpt", lookups)
    assert not (tmp_path / "missing").exists()


def test_a_pods_host_path_volume_is_checked_as_its_type(tmp_path: Path) -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "team", "uid": "u"},
        "spec": {
            "volumes": [
                {"name": "made", "hostPath": {"path": str(tmp_path / "made")}},
                {"name": "strict", "hostPath": {"path": str(tmp_path / "x"), "type": "File"}},
            ]
        },
    }
    with pytest.raises(
        sandbox.MountError,
        match=r'MountVolume\.SetUp failed for volume "strict" : hostPath type check failed',
    ):
        sandbox.prepare_volumes(pod, tmp_path / "pod", pod_ip="10.0.0.2", lookups=None)  # type: ignore[arg-type]
    assert (tmp_path / "made").is_dir()


@pytest.mark.parametrize(
    ("mount_path", "refused"),
    [
        ("/etc/tpujob-probe-scratch", True),
        ("/usr/share/tpujob-probe", True),
        ("/etc", False),  # exists: bound over
        ("/checkpoints", False),  # a new top-level folder, in the pod's own root
        ("/tmp/anything/below", False),
        ("/var/run/tpujob", False),  # /var/run is /run, the pod's own
        ("/dev/shm", False),
    ],
)
def test_mount_points_the_local_node_cannot_make_are_refused_with_a_reason(
    tmp_path: Path, mount_path: str, refused: bool
) -> None:
    # On kind such a pod runs (the runtime makes the mount point in the image); here the
    # container used to end with exit 1 and no message.
    pod = {"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}
    container = {"volumeMounts": [{"name": "v", "mountPath": mount_path}]}
    if not refused:
        assert sandbox.container_mounts(pod, container, {"v": tmp_path})
        return
    with pytest.raises(sandbox.StartError, match=r"cannot make the mount point .*read-only"):
        sandbox.container_mounts(pod, container, {"v": tmp_path})
