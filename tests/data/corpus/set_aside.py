"""Split the shared corpus into a development set and a set-aside, by source repository.

Run once, before any rule is written: `python tests/data/corpus/set_aside.py SRC.jsonl`.
Repositories (`owner/repo`, the part of `source` before `#` or a space) are ordered by the
SHA-256 of `SEED + repo`; walking that order, a repository joins the set-aside file when all
its entries still fit under a fifth of the corpus (rounded up). Every entry of one repository
lands on the same side, so no report's siblings leak into the set-aside fifth.

A second, independently collected file is added once with
`python tests/data/corpus/set_aside.py --add SRC2.jsonl`: the first set-aside (scored once
already) joins the development set; of the new file, only repositories the development set
does not hold, and reports whose text it does not hold, can be set aside; they are ordered
by the SHA-256 of `SEED_2 + repo` and set aside while they fit under a third of the new
file (a fifth would leave about 26 reports, too few to read a figure from). The rest joins
the development set.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from pathlib import Path

SEED = "tpujob-corpus-2026"
SEED_2 = "tpujob-corpus-2026-second"
HERE = Path(__file__).parent


def repository(source: str) -> str:
    return re.split(r"[#\s]", source.strip(), maxsplit=1)[0]


def walk(repos: list[str], by_repo: dict[str, list[str]], budget: int, seed: str) -> set[str]:
    """The repositories set aside: in the order of SHA-256(seed + repo), each whose entries
    all still fit under the budget."""
    order = sorted(repos, key=lambda r: hashlib.sha256(f"{seed}{r}".encode()).hexdigest())
    held: set[str] = set()
    taken = 0
    for repo in order:
        if taken + len(by_repo[repo]) <= budget:
            held.add(repo)
            taken += len(by_repo[repo])
    return held


def main(src: Path) -> None:
    lines = [line for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    by_repo: dict[str, list[str]] = {}
    for line in lines:
        by_repo.setdefault(repository(json.loads(line)["source"]), []).append(line)
    held = walk(list(by_repo), by_repo, math.ceil(len(lines) / 5), SEED)
    dev = [line for line in lines if repository(json.loads(line)["source"]) not in held]
    aside = [line for line in lines if repository(json.loads(line)["source"]) in held]
    (HERE / "errors.jsonl").write_text("\n".join(dev) + "\n", encoding="utf-8")
    (HERE / "set_aside.jsonl").write_text("\n".join(aside) + "\n", encoding="utf-8")
    print(f"development {len(dev)}, set aside {len(aside)} from {len(held)} repositories")


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def add(src: Path) -> None:
    dev = _lines(HERE / "errors.jsonl") + _lines(HERE / "set_aside.jsonl")
    known = {repository(json.loads(line)["source"]) for line in dev}
    texts = {json.loads(line)["text"] for line in dev}
    new = _lines(src)
    by_repo: dict[str, list[str]] = {}
    for line in new:
        by_repo.setdefault(repository(json.loads(line)["source"]), []).append(line)
    eligible = [
        repo
        for repo, lines in by_repo.items()
        if repo not in known and not any(json.loads(line)["text"] in texts for line in lines)
    ]
    held = walk(eligible, by_repo, math.ceil(len(new) / 3), SEED_2)
    aside = [line for line in new if repository(json.loads(line)["source"]) in held]
    dev += [line for line in new if repository(json.loads(line)["source"]) not in held]
    (HERE / "errors.jsonl").write_text("\n".join(dev) + "\n", encoding="utf-8")
    (HERE / "set_aside_2.jsonl").write_text("\n".join(aside) + "\n", encoding="utf-8")
    (HERE / "set_aside.jsonl").unlink()
    print(f"development {len(dev)}, set aside {len(aside)} from {len(held)} repositories")


if __name__ == "__main__":
    if sys.argv[1] == "--add":
        add(Path(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
