"""`tpujob get`, `describe` and `doctor` behave as kubectl does: the context's namespace,
`--context`, `-A`, `-o`, one job by name, and one line on stderr when the cluster cannot
answer. Driven whole against a stand-in apiserver on loopback."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from tests.unit.builders import job_body, running_status
from tests.unit.cli.apiserver import (
    FakeApiserver,
    closed_port,
    job_list,
    jobs_path,
    running_apiserver,
    write_kubeconfig,
)

from tpujob.cli import main
from tpujob.kubeconfig import why_unreachable

COMMANDS = {
    "get": ["get"],
    "describe": ["describe", "train"],
    "doctor": ["doctor"],
    "regrade": ["regrade", "team/train", "--class", "soft", "--why", "flaky storage"],
    "release-jobs": ["release-jobs", "--deployment", "op", "--deployment-namespace", "sys", "-A"],
}


@pytest.fixture
def apiserver() -> Iterator[FakeApiserver]:
    with running_apiserver() as fake:
        yield fake


@pytest.fixture
def kubeconfig(apiserver: FakeApiserver, tmp_path: Path) -> Path:
    """Current context `ctx` in namespace `team`; `bare` names no namespace."""
    return write_kubeconfig(
        tmp_path / "config", apiserver.url, {"ctx": "team", "bare": None}, "ctx"
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    status = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def waiting_job(name: str = "train", namespace: str = "team") -> dict[str, Any]:
    body = job_body(
        slices=2,
        status=running_status(
            attempt=3,
            pools=("pool-a", "pool-b"),
            lastFailure={"class": "hard", "code": "NODE_LOST", "summary": "node gone"},
        ),
    )
    body["metadata"] |= {"name": name, "namespace": namespace}
    return body


@pytest.mark.parametrize("command", COMMANDS, ids=list(COMMANDS))
def test_an_unreachable_cluster_is_one_line_on_stderr_and_exit_1(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = f"https://127.0.0.1:{closed_port()}"
    config = write_kubeconfig(tmp_path / "config", server, {"ctx": "team"}, "ctx")
    status, out, err = run(capsys, *COMMANDS[command], "--kubeconfig", config)
    assert (status, out) == (1, "")
    assert err.splitlines() == [f"tpujob: cannot reach the cluster at {server}: connection refused"]


BAD_KUBECONFIGS = {
    "malformed-yaml": "apiVersion: v1\nclusters: [\n  - {{{\n",
    "not-a-mapping": "- a\n- b\n",
    "no-current-context": "apiVersion: v1\nkind: Config\n",
}


@pytest.mark.parametrize("command", COMMANDS, ids=list(COMMANDS))
@pytest.mark.parametrize("content", BAD_KUBECONFIGS.values(), ids=list(BAD_KUBECONFIGS))
def test_a_bad_kubeconfig_is_one_line_on_stderr_and_exit_1(
    command: str, content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config"
    config.write_text(content)
    status, out, err = run(capsys, *COMMANDS[command], "--kubeconfig", config)
    assert (status, out) == (1, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"tpujob: kubeconfig {config}: ")


def test_a_missing_kubeconfig_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, "get", "--kubeconfig", tmp_path / "absent")
    assert status == 1
    assert len(err.splitlines()) == 1 and err.startswith("tpujob: kubeconfig ")


@pytest.mark.parametrize(
    ("argv", "path"),
    [
        (["get"], jobs_path("team")),
        (["get", "--context", "bare"], jobs_path("default")),
        (["get", "-n", "other"], jobs_path("other")),
        (["get", "-A"], jobs_path()),
        (["describe", "train"], jobs_path("team", "train")),
        (["describe", "train", "--context", "bare"], jobs_path("default", "train")),
        (["describe", "train", "-n", "other"], jobs_path("other", "train")),
    ],
    ids=[
        "get-context-namespace",
        "get-context-without-namespace",
        "get-n",
        "get-all-namespaces",
        "describe-context-namespace",
        "describe-context-without-namespace",
        "describe-n",
    ],
)
def test_the_namespace_read_is_kubectls(
    argv: list[str],
    path: str,
    apiserver: FakeApiserver,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run(capsys, *argv, "--kubeconfig", kubeconfig)
    assert apiserver.requested == [path]


def test_an_unknown_context_is_one_line(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, "get", "--context", "nope", "--kubeconfig", kubeconfig)
    assert status == 1
    assert err.startswith(f"tpujob: kubeconfig {kubeconfig}: ") and "nope" in err
    assert len(err.splitlines()) == 1


def test_get_lists_the_namespace_without_a_namespace_column(
    apiserver: FakeApiserver, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.routes[jobs_path("team")] = job_list(waiting_job("a"), waiting_job("b"))
    status, out, _ = run(capsys, "get", "--kubeconfig", kubeconfig)
    lines = out.splitlines()
    assert status == 0
    assert lines[0].split()[:2] == ["NAME", "PHASE"]
    assert [line.split()[0] for line in lines[1:]] == ["a", "b"]


def test_get_all_namespaces_adds_the_namespace_column(
    apiserver: FakeApiserver, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.routes[jobs_path()] = job_list(waiting_job("a", "x"), waiting_job("b", "y"))
    _, out, _ = run(capsys, "get", "-A", "--kubeconfig", kubeconfig)
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert [line.split()[:2] for line in lines[1:]] == [["x", "a"], ["y", "b"]]


def test_get_wide_adds_attempt_node_pools_and_last_failure(
    apiserver: FakeApiserver, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.routes[jobs_path("team")] = job_list(waiting_job())
    _, out, _ = run(capsys, "get", "-o", "wide", "--kubeconfig", kubeconfig)
    header, row = out.splitlines()
    assert header.split()[-5:] == ["ATTEMPT", "NODE", "POOLS", "LAST", "FAILURE"]
    assert row.split()[-3:] == ["3", "pool-a,pool-b", "NODE_LOST"]


@pytest.mark.parametrize(
    ("flags", "load"),
    [(["-o", "json"], json.loads), (["-o", "yaml"], yaml.safe_load), (["--json"], json.loads)],
    ids=["json", "yaml", "deprecated-json"],
)
def test_get_prints_the_api_objects_for_scripts(
    flags: list[str],
    load: Any,
    apiserver: FakeApiserver,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    listed = job_list(waiting_job())
    apiserver.routes[jobs_path("team")] = listed
    apiserver.routes[jobs_path("team", "train")] = waiting_job()
    _, out, _ = run(capsys, "get", *flags, "--kubeconfig", kubeconfig)
    assert load(out) == listed
    _, out, _ = run(capsys, "get", "train", *flags, "--kubeconfig", kubeconfig)
    assert load(out) == waiting_job()


def test_the_deprecated_json_flag_says_so_on_stderr(
    apiserver: FakeApiserver, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.routes[jobs_path("team")] = job_list()
    _, _, err = run(capsys, "get", "--json", "--kubeconfig", kubeconfig)
    assert err == "tpujob: --json is deprecated; use -o json\n"


@pytest.mark.parametrize(
    ("flag", "load"), [("json", json.loads), ("yaml", yaml.safe_load)], ids=["json", "yaml"]
)
def test_describe_prints_the_summary_and_status_for_scripts(
    flag: str,
    load: Any,
    apiserver: FakeApiserver,
    kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    apiserver.routes[jobs_path("team", "train")] = waiting_job()
    status, out, _ = run(capsys, "describe", "train", "-o", flag, "--kubeconfig", kubeconfig)
    data = load(out)
    assert status == 0
    assert (data["name"], data["attempt"], data["nodePools"]) == ("train", 3, ["pool-a", "pool-b"])
    assert data["status"]["lastFailure"]["code"] == "NODE_LOST"


def test_get_by_name_shows_just_that_job(
    apiserver: FakeApiserver, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.routes[jobs_path("team", "train")] = waiting_job()
    status, out, _ = run(capsys, "get", "train", "--kubeconfig", kubeconfig)
    assert status == 0
    assert [line.split()[0] for line in out.splitlines()] == ["NAME", "train"]
    assert apiserver.requested == [jobs_path("team", "train")]


@pytest.mark.parametrize("command", ["get", "describe"])
def test_a_missing_job_is_one_line_on_stderr_and_exit_1(
    command: str, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = run(capsys, command, "x", "-n", "y", "--kubeconfig", kubeconfig)
    assert (status, out) == (1, "")
    assert err == 'tpujob: TPUTrainingJob "x" not found in namespace "y"\n'


def test_get_by_name_across_all_namespaces_is_refused(
    apiserver: FakeApiserver, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, _, err = run(capsys, "get", "train", "-A", "--kubeconfig", kubeconfig)
    assert status == 1 and len(err.splitlines()) == 1
    assert apiserver.requested == []


def test_an_empty_namespace_says_so_on_stderr(
    apiserver: FakeApiserver, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver.routes[jobs_path("team")] = job_list()
    status, out, err = run(capsys, "get", "--kubeconfig", kubeconfig)
    assert (status, out, err) == (0, "", "No TPUTrainingJobs found in team namespace.\n")


def test_a_refused_read_is_one_line_with_the_apis_reason(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # No route: the list itself answers 404, as when the CRD is not installed.
    status, _, err = run(capsys, "get", "--kubeconfig", kubeconfig)
    assert status == 1
    assert err.splitlines() == [
        'tpujob: NotFound: tputrainingjobs.tpujob.dev "tputrainingjobs" not found'
    ]


def test_version_is_the_packages(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"tpujob {version('tpujob')}\n"


def test_version_from_a_source_tree_is_the_packages_own(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    import tpujob
    from tpujob import cli

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(tpujob, "__version__", "9.9.9")
    assert cli.version() == "9.9.9"


def caused(err: BaseException, cause: BaseException) -> BaseException:
    err.__cause__ = cause
    return err


@pytest.mark.parametrize(
    ("err", "said"),
    [
        (
            urllib3.exceptions.MaxRetryError(
                None,  # type: ignore[arg-type]
                "/apis",
                caused(
                    urllib3.exceptions.NewConnectionError(None, "Failed to establish"),  # type: ignore[arg-type]
                    ConnectionRefusedError(111, "Connection refused"),
                ),
            ),
            "connection refused",
        ),
        (
            urllib3.exceptions.MaxRetryError(
                None,  # type: ignore[arg-type]
                "/apis",
                urllib3.exceptions.ConnectTimeoutError("connect timeout=5.0"),
            ),
            "timed out",
        ),
        (
            caused(OSError("lookup"), socket.gaierror(-2, "Name or service not known")),
            "name or service not known",
        ),
        (ValueError("odd\n  thing"), "odd thing"),
    ],
    ids=["refused", "timed-out", "dns", "other"],
)
def test_an_unreachable_cluster_is_said_by_its_root_cause(err: BaseException, said: str) -> None:
    assert why_unreachable(err) == said


def test_in_a_pod_the_namespace_is_the_pods_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpujob.kube import client

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setattr(client, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "namespace")
    assert client.context_namespace() == "default"
    (tmp_path / "namespace").write_text("team-a\n")
    assert client.context_namespace() == "team-a"
