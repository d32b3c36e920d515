"""A dump written to a URL (`--out s3://bucket/prefix`): the objects under the prefix are
the local layout, byte for byte, on a store that has no rename and no lock.

- Each shard is finished in a local spool folder (`--spool`), then uploaded whole with the
  client's own `put_file` (s3fs sends large files as multipart uploads), checked (the
  object's size), and deleted from the spool. Its size and checksum go into the manifest.
- A manifest is one PUT, made only after every shard it lists is uploaded and checked; the
  complete one is written last. Between them, manifests say `complete: false`.
- Only names a dump uses are ever written or removed, and only directly under the prefix:
  `run1` never touches `run10/` or `run1-notes.txt`.
- The client's own retries handle throttling and dropped connections; a failure that
  outlasts them is one line naming the object (values of storage options blanked).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from hookdump.errors import HookdumpError, opt
from hookdump.format.manifest import ShardEntry
from hookdump.format.names import DUMP_FILE, MANIFEST, URL_LOCK
from hookdump.store.checksum import (
    CHUNK,
    Checksum,
    crc32c,
    crc_base64,
    crc_hex,
    matches,
    recorded,
    stream_checksum,
)
from hookdump.store.folder import check_entries
from hookdump.store.location import Remote, etag_of
from hookdump.store.write.place import manifest_bytes

T = TypeVar("T")
# shard files in the spool at most: one being written, two waiting, one going up
SPOOL_SHARDS = 4


class Upload:
    """The prefix a dump is written under, and what goes up to it."""

    def __init__(self, remote: Remote, run_id: str | None = None) -> None:
        self.remote = remote
        self.url = remote.url
        self.run_id = run_id  # the run's (its lock names it): a new dump's shards carry it
        # an old dump's objects, removed before the first upload (None: nothing to remove)
        self._old: list[str] | None = None

    def attempt(self, what: str, action: Callable[[], T], writing: bool = True) -> T:
        """`action()`, a storage client's failure made one line naming `what` (and, while
        `writing`, how to go on)."""
        then = (
            f"; the shards uploaded so far are kept: run the same command with "
            f"{opt('resume', True)} to finish the dump"
            if writing
            else ""
        )
        with self.remote.failing(what, then=then):
            return action()

    def make_prefix(self) -> None:
        """A file system with folders (`file://`) gets the prefix's; an object store has
        no folders to make (and a bucket is never made here)."""
        fs = self.remote.fs
        protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
        if protocols & {"file", "local"}:
            self.attempt(f"make {self.url}", lambda: fs.makedirs(self.remote.root, exist_ok=True))

    def entries(self) -> list[str]:
        """The names directly under the prefix (a folder's with a trailing '/')."""
        return self.remote.entries()

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
        fs = self.remote.fs
        for name in names:
            path = self.remote.object(name)

            def gone(path: str = path) -> None:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm_file(path)

            self.attempt(f"remove {self.url / name}", gone)

    def put_shard(self, local: Path, name: str, checksum: Checksum) -> dict[str, Any]:
        """Upload a finished shard file (of that `checksum`) as object `name`, check it, and
        delete the local file; its size and checksum, for the manifest."""
        size = checksum.bytes
        path, fs = self.remote.object(name), self.remote.fs
        self.attempt(f"upload {self.url / name}", lambda: self._put(local, path, checksum))
        info = self.attempt(f"check {self.url / name}", lambda: fs.info(path, refresh=True))
        if int(info.get("size") or 0) != size:
            raise HookdumpError(
                f"{self.url / name} holds {info.get('size')} bytes after its upload, not "
                f"{size}; run the same command with {opt('resume', True)} to upload it again"
            )
        local.unlink()
        entry = checksum.entry()
        if etag := etag_of(info):  # what this version of the object is: `--resume` compares it
            entry["etag"] = etag
        return entry

    def _put(self, local: Path, path: str, checksum: Checksum) -> None:
        """Upload `local` as object `path`; to S3 with its CRC32C, which the server checks
        before it stores the object (a multipart upload's as one full-object checksum,
        each part's beside it), so a shard damaged on the way is refused, not stored."""
        fs = self.remote.fs
        if checksum.crc32c is None or not hasattr(fs, "call_s3"):
            fs.put_file(str(local), path)
            return
        bucket, key = path.split("/", 1)
        whole = crc_base64(checksum.crc32c)
        if checksum.bytes <= PART_BYTES:
            body = local.read_bytes()
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, ChecksumCRC32C=whole)
        else:
            _put_parts(fs, local, bucket, key, whole)
        fs.invalidate_cache(path)

    def put_json(self, name: str, data: Mapping[str, Any]) -> int:
        """One PUT of a JSON object (a manifest); the bytes written."""
        raw = manifest_bytes(data)
        self.put_bytes(name, raw)
        return len(raw)

    def put_bytes(self, name: str, raw: bytes) -> None:
        """One PUT of a small object."""
        path, fs = self.remote.object(name), self.remote.fs
        self.attempt(f"write {self.url / name}", lambda: fs.pipe_file(path, raw))

    def matches(self, entry: ShardEntry) -> bool:
        """Whether the listed shard's object is there with the size and checksum its entry
        records: the object uploaded then (the ETag recorded, where the store gives one)
        is taken as checked; another is read back whole. What is not recorded is not
        compared."""
        name = entry.file
        fs, path = self.remote.fs, self.remote.object(name)
        size, algorithm = entry.bytes, recorded(entry)

        def check() -> bool:
            try:
                info = fs.info(path, refresh=True)
            except FileNotFoundError:
                return False
            if size is not None and int(info.get("size") or 0) != size:
                return False
            if algorithm is None or (entry.etag and entry.etag == etag_of(info)):
                return True
            with fs.open(path, "rb", block_size=CHUNK) as file:
                return matches(entry, stream_checksum(file.read, algorithm))

        return self.attempt(f"read {self.url / name}", check)

    def abort_unfinished(self, mine: Callable[[str], bool]) -> int:
        """Abort the unfinished multipart uploads of objects directly under the prefix
        whose names `mine` claims (a killed run's); how many. Only S3 has them."""
        fs = self.remote.fs
        if not hasattr(fs, "call_s3"):
            return 0
        bucket, _, key = self.remote.root.partition("/")
        prefix = f"{key}/" if key else ""

        def abort() -> int:
            try:
                listed = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=prefix)
            except Exception as exc:
                if _cannot_list_uploads(exc):
                    return 0  # a server that cannot list them has none to abort
                raise
            done = 0
            for upload in listed.get("Uploads", []) or []:
                name = str(upload.get("Key", ""))[len(prefix) :]
                if "/" not in name and mine(name):
                    fs.call_s3(
                        "abort_multipart_upload",
                        Bucket=bucket,
                        Key=upload["Key"],
                        UploadId=upload["UploadId"],
                    )
                    done += 1
            return done

        return self.attempt(f"list the unfinished uploads under {self.url}", abort, writing=False)


# what servers that keep no list of multipart uploads answer a listing with: rclone's `serve
# s3` NoSuchUpload, others NotImplemented
_NO_UPLOAD_LISTING = {"NoSuchUpload", "NotImplemented", "MethodNotAllowed"}


def _cannot_list_uploads(exc: BaseException) -> bool:
    """Whether `exc` (s3fs's, or the botocore error behind it) says the server does not
    list multipart uploads."""
    for err in (exc, exc.__cause__, exc.__context__):
        response = getattr(err, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in (
            _NO_UPLOAD_LISTING
        ):
            return True
    return str(exc) in _NO_UPLOAD_LISTING


PART_BYTES = 64 << 20  # a shard larger than this goes up in parts of this size


def _put_parts(fs: Any, local: Path, bucket: str, key: str, whole: str) -> None:
    """A multipart upload of `local`, each part with its CRC32C and the whole object's
    (`whole`, base64) checked once joined; aborted on any error."""
    started = fs.call_s3(
        "create_multipart_upload",
        Bucket=bucket,
        Key=key,
        ChecksumAlgorithm="CRC32C",
        ChecksumType="FULL_OBJECT",
    )
    upload = started["UploadId"]
    try:
        parts: list[dict[str, Any]] = []
        with local.open("rb") as file:
            while chunk := file.read(PART_BYTES):
                number = len(parts) + 1
                crc = crc_base64(crc_hex(crc32c(chunk)))
                done = fs.call_s3(
                    "upload_part",
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload,
                    PartNumber=number,
                    Body=chunk,
                    ChecksumCRC32C=crc,
                )
                parts.append({"PartNumber": number, "ETag": done["ETag"], "ChecksumCRC32C": crc})
        fs.call_s3(
            "complete_multipart_upload",
            Bucket=bucket,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": parts},
            ChecksumCRC32C=whole,
            ChecksumType="FULL_OBJECT",
        )
    except BaseException:
        with contextlib.suppress(Exception):
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload)
        raise
