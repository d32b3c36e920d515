"""Where a run's dump goes, held for the run: the `DumpPlace` that `--out` names (a folder
or a URL, `store.write.place`), locked by the process that writes its manifest; its shards
are finished in the place's own `work`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from hookdump.engine.options import RunOptions
from hookdump.store.write.place import DumpPlace, open_place


@contextlib.contextmanager
def held(options: RunOptions, main: bool, resumable: bool = True) -> Iterator[DumpPlace | None]:
    """For a run with `--out`: its place, held until the block ends (`main`: the one
    process, or torchrun's rank 0, takes the place's lock; `resumable`: a refusal may offer
    `--resume`); its shards are finished in the place's `work`. Without `--out`, None."""
    dump = options.dump
    if dump.out is None:
        yield None
        return
    place = open_place(dump.out, dump.storage_options, dump.spool)
    with place.held(main, dump.resume or dump.overwrite, resumable):
        yield place
