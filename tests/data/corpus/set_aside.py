"""Split the shared corpus into a development set and a set-aside fifth, by source repository.

Run once, before any rule is written: `python tests/data/corpus/set_aside.py SRC.jsonl`.
Repositories (`owner/repo`, the part of `source` before `#` or a space) are ordered by the
SHA-256 of `SEED + repo`; walking that order, a repository joins the set-aside file when all
its entries still fit under a fifth of the corpus (rounded up). Every entry of one repository
lands on the same side, so no report's siblings leak into the set-aside fifth.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from pathlib import Path

SEED = "tpujob-corpus-2026"
HERE = Path(__file__).parent


def repository(source: str) -> str:
    return re.split(r"[#\s]", source.strip(), maxsplit=1)[0]


def main(src: Path) -> None:
    lines = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_repo: dict[str, list[str]] = {}
    for line in lines:
        by_repo.setdefault(repository(json.loads(line)["source"]), []).append(line)
    budget = math.ceil(len(lines) / 5)
    order = sorted(by_repo, key=lambda r: hashlib.sha256(f"{SEED}{r}".encode()).hexdigest())
    held: set[str] = set()
    taken = 0
    for repo in order:
        if taken + len(by_repo[repo]) <= budget:
            held.add(repo)
            taken += len(by_repo[repo])
    dev = [line for line in lines if repository(json.loads(line)["source"]) not in held]
    aside = [line for line in lines if repository(json.loads(line)["source"]) in held]
    (HERE / "errors.jsonl").write_text("\n".join(dev) + "\n", encoding="utf-8")
    (HERE / "set_aside.jsonl").write_text("\n".join(aside) + "\n", encoding="utf-8")
    print(f"development {len(dev)}, set aside {len(aside)} from {len(held)} repositories")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
