"""`python -m tpujob.local.agent --state-dir DIR`: run the node agent of the cluster in DIR."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from tpujob.local.agent.agent import Agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    Agent(args.state_dir.resolve()).run()


if __name__ == "__main__":
    main()
