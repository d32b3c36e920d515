"""Where a run's dump goes, held for the run: the `DumpPlace` that `--out` names (a folder
or a URL, `store.write.place`), locked by the process that writes its manifest, and the
options with `out` set to the local folder its shards are finished in."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

from hookdump.engine.options import RunOptions
from hookdump.store.write.place import DumpPlace, open_place


@contextlib.contextmanager
def held(
    options: RunOptions, main: bool, resumable: bool = True
) -> Iterator[tuple[RunOptions, DumpPlace | None]]:
    """For a run with `--out`: its place, held until the block ends (`main`: the one
    process, or torchrun's rank 0, takes the place's lock; `resumable`: a refusal may offer
    `--resume`), and the options with `out` the folder shards are finished in. Without
    `--out`, the options and None."""
    dump = options.dump
    where = dump.url if dump.url is not None else dump.out
    if where is None:
        yield options, None
        return
    place = open_place(where, dump.storage_options, dump.spool)
    with place.held(main, dump.resume or dump.overwrite, resumable) as work:
        yield dataclasses.replace(options, dump=dataclasses.replace(dump, out=work)), place
