"""A dump written to a URL (`--out s3://bucket/prefix`): the objects under the prefix are
the local layout, byte for byte, on a store that has no rename and no lock.

- Each shard is finished in a local spool folder (`--spool`), then uploaded whole
  (`UrlMedium.put_file`: to S3 with its CRC32C, which the server checks), checked (the
  object's size), and deleted from the spool. Its size and checksum go into the manifest.
- A manifest is one PUT, made only after every shard it lists is uploaded and checked; the
  complete one is written last. Between them, manifests say `complete: false`.
- Only names a dump uses are ever written or removed, and only directly under the prefix:
  `run1` never touches `run10/` or `run1-notes.txt`.
- The client's own retries handle throttling and dropped connections; a failure that
  outlasts them is one line naming the object (values of storage options blanked), and
  while writing, how to go on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import DUMP_FILE, MANIFEST, URL_LOCK
from hookdump.store.checksum import Checksum, matches, recorded, stream_checksum
from hookdump.store.folder import check_entries
from hookdump.store.location import Remote, StorageError
from hookdump.store.media import UrlMedium
from hookdump.store.write.place import manifest_bytes

# shard files in the spool at most: one being written, two waiting, one going up
SPOOL_SHARDS = 4


class Upload:
    """The prefix a dump is written under, and what goes up to it."""

    def __init__(self, remote: Remote, run_id: str | None = None) -> None:
        self.medium = UrlMedium(remote)
        self.remote = remote
        self.url = remote.url
        self.run_id = run_id  # the run's (its lock names it): a new dump's shards carry it
        # an old dump's objects, removed before the first upload (None: nothing to remove)
        self._old: list[str] | None = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A storage failure within the block says, beside what failed, how to go on."""
        try:
            yield
        except StorageError as exc:
            raise HookdumpError(
                f"{exc.args[0]}; the shards uploaded so far are kept: run the same command "
                f"with {opt('resume', True)} to finish the dump"
            ) from None

    def entries(self) -> list[str]:
        """The names directly under the prefix (a folder's with a trailing '/')."""
        return self.medium.names()

    def check_prefix(self, overwrite: bool, ignore: Iterable[str] = (URL_LOCK,)) -> None:
        """Refuse a prefix that cannot take a dump, as `store.folder.check_out_dir` refuses
        a folder; with `overwrite`, note the old dump's objects, removed before the first
        upload (`clear_old`)."""
        present = [name for name in self.entries() if name not in set(ignore)]
        check_entries(str(self.url), present, overwrite, "prefix")
        # the manifest first: a half-removed dump never reads as complete (an empty list
        # all the same: a killed run's unfinished uploads may be there)
        self._old = sorted(present, key=lambda name: name != MANIFEST)

    def clear_old(self) -> None:
        """Remove the old dump's objects (`check_prefix` with `overwrite`), and abort its
        unfinished uploads, once."""
        if self._old is None:
            return
        old, self._old = self._old, None
        self.abort_unfinished(lambda name: bool(DUMP_FILE.match(name)))
        self.remove(old)

    def keep(self, name: str) -> None:
        """Object `name` is this run's (written before the old dump's objects go)."""
        if self._old is not None and name in self._old:
            self._old.remove(name)

    def forget_old(self) -> None:
        """Leave the old dump to another process (torchrun's rank 0 removes it)."""
        self._old = None

    def remove(self, names: Iterable[str]) -> None:
        """Remove objects by name, in order; those already gone are no error."""
        with self.writing():
            for name in names:
                self.medium.delete(name)

    def abort_unfinished(self, mine: Callable[[str], bool]) -> int:
        """Abort the unfinished multipart uploads of objects directly under the prefix
        whose names `mine` claims (a killed run's); how many."""
        return self.medium.abort_unfinished(mine)

    def put_shard(self, local: Path, name: str, checksum: Checksum) -> dict[str, Any]:
        """Upload a finished shard file (of that `checksum`) as object `name`, check it, and
        delete the local file; its size and checksum, for the manifest."""
        with self.writing():
            stored = self.medium.put_file(local, name, checksum.crc32c)
        if stored.size != checksum.bytes:
            raise HookdumpError(
                f"{self.url / name} holds {stored.size} bytes after its upload, not "
                f"{checksum.bytes}; run the same command with {opt('resume', True)} to upload "
                "it again"
            )
        entry = checksum.entry()
        if stored.etag:  # what this version of the object is: `--resume` compares it
            entry["etag"] = stored.etag
        return entry

    def put_json(self, name: str, data: Mapping[str, Any]) -> int:
        """One PUT of a JSON object (a manifest); the bytes written."""
        raw = manifest_bytes(data)
        self.put_bytes(name, raw)
        return len(raw)

    def put_bytes(self, name: str, raw: bytes) -> None:
        """One PUT of a small object."""
        with self.writing():
            self.medium.put(name, raw)

    def matches(self, entry: ShardEntry) -> bool:
        """Whether the listed shard's object is there with the size and checksum its entry
        records: the object uploaded then (the ETag recorded, where the store gives one)
        is taken as checked; another is read back whole. What is not recorded is not
        compared."""
        size, algorithm = entry.bytes, recorded(entry)
        with self.writing():
            found = self.medium.info(entry.file)
            if found is None or (size is not None and found.size != size):
                return False
            if algorithm is None or (entry.etag and entry.etag == found.etag):
                return True
            with self.medium.reading(entry.file) as read:
                return matches(entry, stream_checksum(read, algorithm))
