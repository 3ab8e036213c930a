"""Contract tests for `make release`: the chart takes an image digest, and the values file
hack/release.sh writes is one the chart accepts, naming the pushed operator image by digest.

They need only the helm binary; hack/release-check.sh pushes a real release to a registry on
the loopback address and pulls it back.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.binaries import REPO_ROOT, binary

CHART = REPO_ROOT / "charts" / "tpujob-operator"
DIGEST = "sha256:" + "0123456789abcdef" * 4


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary("helm")), "template", "tpujob", str(CHART), "-n", "tpujob-system", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def images(rendered: str) -> set[str]:
    return {
        container["image"]
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "Deployment"
        for container in doc["spec"]["template"]["spec"]["containers"]
    }


def test_an_image_digest_pins_the_operator_image() -> None:
    result = helm_template("--set", f"image.digest={DIGEST}", "--set", "image.tag=1.2.3")
    assert result.returncode == 0, result.stderr
    assert images(result.stdout) == {f"ghcr.io/tpujob/tpujob-operator:1.2.3@{DIGEST}"}


@pytest.mark.parametrize("digest", ["sha256:abc", "latest", DIGEST.upper(), f"{DIGEST}x"])
def test_a_digest_that_is_not_sha256_is_refused_by_the_schema(digest: str) -> None:
    result = helm_template("--set", f"image.digest={digest}")
    assert result.returncode != 0
    assert "/image/digest" in result.stderr


def release_values(registry: str, tag: str, digest: str, out: str) -> dict[str, Any]:
    """The values file hack/release.sh writes, for these pushed names."""
    script = (REPO_ROOT / "hack" / "release.sh").read_text()
    heredoc = re.search(r'cat >"\$out/values-release.yaml" <<YAML\n(.*?)\nYAML\n', script, re.S)
    assert heredoc is not None, "release.sh writes no values-release.yaml"
    text = (
        heredoc.group(1)
        .replace("${pushed[operator]}", digest)
        .replace("$registry", registry)
        .replace("$tag", tag)
        .replace("$out", out)
    )
    assert "$" not in text.replace("\\\n", ""), text
    values: dict[str, Any] = yaml.safe_load(text)
    return values


def test_release_values_name_the_pushed_operator_by_digest(tmp_path: Path) -> None:
    values = release_values("127.0.0.1:5000/tpujob", "0.1.0", DIGEST, "dist")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["image"]) <= set(defaults["image"])
    path = tmp_path / "values-release.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm_template("-f", str(path))
    assert result.returncode == 0, result.stderr
    assert images(result.stdout) == {f"127.0.0.1:5000/tpujob/tpujob-operator:0.1.0@{DIGEST}"}
