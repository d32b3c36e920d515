"""What the shards' SHA-256 cost a whole run (issue 44): `feature_stats.py`'s jobs (the main
job, resnet50 every leaf, 8.2 GB; the token job, 0.30 GB) in fresh `hookdump run` processes,
as they are and with each shard's checksum left out (`take_checksum` answering a made-up
one without reading the file), paired and alternating.

    python benchmarks/checksums.py [--reps 5] [--only vision,tokens]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from feature_stats import JOBS, bench
from process import settle

# the CLI with no shard read back for its checksum, nothing else changed
WITHOUT = (
    "import os, sys\n"
    "from hookdump.cli import main, wait_passively\n"
    "wait_passively(os.environ)  # as main() does, before torch loads\n"
    "from hookdump.store.checksum import Checksum\n"
    "from hookdump.store.write import shards\n"
    "def made_up(shard):\n"
    "    shard.checksum = Checksum(shard.sealed.stat().st_size, '0' * 64)\n"
    "    return shard.checksum\n"
    "shards._Sealed.take_checksum = made_up\n"
    "sys.argv[0] = 'hookdump'\n"
    "main()\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default=",".join(JOBS), help="of " + ",".join(JOBS))
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-bench-", dir=os.environ.get("BENCH_DIR")))
    try:
        for job in args.only.split(","):
            print(job, json.dumps(bench(job, scratch, args.reps, WITHOUT), indent=2), flush=True)
    finally:
        settle(scratch)


if __name__ == "__main__":
    main()
