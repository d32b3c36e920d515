"""What the shards' checksums cost a whole run (issues 44, 55): `feature_stats.py`'s jobs (the
main job, resnet50 every leaf, 8.2 GB; the token job, 0.30 GB) in fresh `hookdump run`
processes, as they are (each shard's CRC32C taken from memory as its bytes are written, the
header folded in) and with no checksum at all (`Crc.add` and `Crc.join` made no-ops, so
nothing is computed and nothing read back), paired and alternating.

    python benchmarks/checksums.py [--reps 5] [--only vision,tokens]
"""

from __future__ import annotations

from feature_stats import main, patched_cli

# the CLI with no CRC taken of any byte, nothing else changed (the shards record a wrong one)
WITHOUT = patched_cli(
    "from hookdump.store import checksum\n"
    "checksum.Crc.add = lambda self, data: None\n"
    "checksum.Crc.join = lambda self, other: None\n"
)


if __name__ == "__main__":
    main(WITHOUT, __doc__)
