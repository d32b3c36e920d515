"""A prefix at a URL, through its fsspec client (`store.location.Remote`): entries are the
objects directly under it; a put is one request, whole or not at all; a finished local
file goes up whole (to S3 with its CRC32C, checked by the server before it stores it).

A create is atomic where the store honours a conditional put (S3's `If-None-Match: *`,
GCS's generation 0, Azure's `overwrite=False`, and fsspec's in-process `memory://`);
anywhere else a lock cannot be taken safely, and writing is refused (`refuse_weak_lock`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from hookdump.errors import InvalidDump
from hookdump.store.checksum import CHUNK, crc32c, crc_base64, crc_hex
from hookdump.store.location import Remote, UrlPath, etag_of, version_of
from hookdump.store.media.base import Info, Medium, too_large
from hookdump.store.media.blob import Blob

# the protocols whose `pipe_file(mode="create")` is a conditional put
ATOMIC_CREATE = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "memory"}
PART_BYTES = 64 << 20  # a file larger than this goes up in parts of this size
HEAD_BYTES = 64 << 10  # read of an object's start at once: a shard's header fits, mostly
# blocks a reader asks for ahead of their read: each a request per key in flight, so the
# memory beyond a pass's buffers is at most this many blocks
READS_AHEAD = 8


class UrlMedium(Medium):
    renames = False
    poll_s = 0.5  # each look a request
    reads_ahead = READS_AHEAD

    def __init__(self, remote: Remote) -> None:
        self._remote = remote
        self.protocol = remote.url.split("://", 1)[0].lower()

    @property
    def atomic_create(self) -> bool:  # type: ignore[override]
        return self.protocol in ATOMIC_CREATE

    @property
    def root(self) -> UrlPath:
        return self._remote.url

    def read(self, name: str, most: int | None = None, limit: int | None = None) -> bytes | None:
        remote = self._remote
        try:
            with remote.failing(f"read {remote.url / name}", passing=(FileNotFoundError,)):
                if limit is not None:  # its size asked first: never a download to refuse
                    found = remote.fs.info(remote.object(name), refresh=True)
                    size = _file_size(found, remote.url / name)
                    if size > limit:
                        raise too_large(remote.url / name, size, limit)
                return bytes(remote.fs.cat_file(remote.object(name), start=0, end=most))
        except FileNotFoundError:
            return None

    def info(self, name: str) -> Info | None:
        remote = self._remote
        try:
            with remote.failing(f"read {remote.url / name}", passing=(FileNotFoundError,)):
                found = remote.fs.info(remote.object(name), refresh=True)
        except FileNotFoundError:
            return None
        return Info(int(found.get("size") or 0), version_of(found), etag_of(found))

    def blob(self, name: str, what: str) -> Blob:
        return RemoteBlob(self._remote, name)

    @contextlib.contextmanager
    def reading(self, name: str) -> Iterator[Callable[[int], bytes]]:
        remote = self._remote
        with (
            remote.failing(f"read {remote.url / name}"),
            remote.fs.open(remote.object(name), "rb", block_size=CHUNK) as file,
        ):
            yield file.read

    def names(self) -> list[str]:
        return self._remote.entries()

    def put(self, name: str, raw: bytes, durable: bool = True) -> None:
        remote = self._remote
        with remote.failing(f"write {remote.url / name}"):
            remote.fs.pipe_file(remote.object(name), raw)

    def put_if_absent(self, name: str, raw: bytes) -> bool:
        remote = self._remote
        with remote.failing(f"write {remote.url / name}"):
            try:
                remote.fs.pipe_file(remote.object(name), raw, mode="create")
            except FileExistsError:
                return False
        return True

    def put_file(self, local: Path, name: str, crc32c: str | None) -> Info:
        remote = self._remote
        with remote.failing(f"upload {remote.url / name}"):
            self._upload(local, remote.object(name), crc32c)
        found = self.info(name)
        local.unlink()
        return found if found is not None else Info(-1, None)

    def _upload(self, local: Path, path: str, crc: str | None) -> None:
        fs = self._remote.fs
        if crc is None or not hasattr(fs, "call_s3"):
            fs.put_file(str(local), path)
            return
        bucket, key = path.split("/", 1)
        whole = crc_base64(crc)
        if local.stat().st_size <= PART_BYTES:
            body = local.read_bytes()
            fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, ChecksumCRC32C=whole)
        else:
            _put_parts(fs, local, bucket, key, whole)
        fs.invalidate_cache(path)

    def delete(self, name: str) -> None:
        remote = self._remote
        with remote.failing(f"remove {remote.url / name}"), contextlib.suppress(FileNotFoundError):
            remote.fs.rm_file(remote.object(name))

    def abort_unfinished(self, mine: Callable[[str], bool]) -> int:
        """Abort the unfinished multipart uploads of entries whose names `mine` claims (a
        killed run's); how many. Only S3 has them."""
        fs = self._remote.fs
        if not hasattr(fs, "call_s3"):
            return 0
        bucket, _, key = self._remote.root.partition("/")
        prefix = f"{key}/" if key else ""
        with self._remote.failing(f"list the unfinished uploads under {self.root}"):
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


class RemoteBlob:
    """One object read at offsets, as `SafetensorsFile` and the row readers read a file: a
    range announced (`will_need`) is asked for at once, beside the others in flight, and
    taken by the read of that very range."""

    vectored = False

    def __init__(self, remote: Remote, name: str) -> None:
        self.remote, self.name = remote, name
        info = remote.info(name)
        self.size = _file_size(info, remote.url / name)
        self.identity: tuple[object, ...] = (self.size, version_of(info))
        self._head = b""  # the object's first bytes, read once: a shard's header is there
        self._asked: dict[tuple[int, int], Future[bytes]] = {}  # (offset, nbytes): in flight

    def pread(self, nbytes: int, offset: int) -> bytes:
        asked = self._asked.pop((offset, nbytes), None)
        if asked is not None:
            return self.remote.take(self.name, asked)
        end = min(offset + nbytes, self.size)
        if end <= offset:
            return b""
        if end <= HEAD_BYTES:
            if len(self._head) < min(HEAD_BYTES, self.size):
                self._head = self.remote.read(self.name, 0, min(HEAD_BYTES, self.size))
            return self._head[offset:end]
        return self.remote.read(self.name, offset, end)

    def readinto(self, view: memoryview, offset: int) -> int:
        data = self.pread(len(view), offset)
        view[: len(data)] = data
        return len(data)

    def holds_data(self, offset: int, nbytes: int) -> bool:
        return True  # an object store keeps no holes

    def will_need(self, offset: int, nbytes: int) -> None:
        end = min(offset + nbytes, self.size)
        if end > offset and (offset, nbytes) not in self._asked:
            self._asked[(offset, nbytes)] = self.remote.fetch(self.name, offset, end)

    def read_vectors(self, vectors: np.ndarray, offset: int) -> int:
        raise NotImplementedError("not vectored: read its bytes")

    def close(self) -> None:
        self._asked.clear()  # what is in flight ends on its own; nobody takes it


def _file_size(found: Mapping[str, Any], where: UrlPath) -> int:
    """An object's size, as its listing gives it; refused where it is no file (a prefix)."""
    if found.get("type", "file") != "file":
        raise InvalidDump(f"{where} is not a file; refused")
    return int(found.get("size") or 0)


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
