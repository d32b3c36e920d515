"""What the shards' SHA-256 cost a whole run (issue 44): `feature_stats.py`'s jobs (the main
job, resnet50 every leaf, 8.2 GB; the token job, 0.30 GB) in fresh `hookdump run` processes,
as they are and with each shard's checksum left out (`take_checksum` answering a made-up
one without reading the file), paired and alternating.

    python benchmarks/checksums.py [--reps 5] [--only vision,tokens]
"""

from __future__ import annotations

from feature_stats import main, patched_cli

# the CLI with no shard read back for its checksum, nothing else changed
WITHOUT = patched_cli(
    "from hookdump.store.checksum import Checksum\n"
    "from hookdump.store.write import shards\n"
    "def made_up(shard):\n"
    "    shard.checksum = Checksum(shard.sealed.stat().st_size, '0' * 64)\n"
    "    return shard.checksum\n"
    "shards._Sealed.take_checksum = made_up\n"
)


if __name__ == "__main__":
    main(WITHOUT, __doc__)
