"""A corpus's documents, read in bounded pieces: however long a line (or a file, or standard
input with no newline at all), no more than a few pieces of it are held at a time.

Sources (`--text`): a `.txt` file (a document per non-blank line), a `.jsonl` file (a JSON
object per line, the document under `--text-field`), either gzip-compressed (`.txt.gz`,
`.jsonl.gz`, decompressed as it is read), a folder of `.txt` (or `.txt.gz`) files (a document
per file, sorted by path), a `.parquet` file or a folder of them, a `datasets` folder saved
with `save_to_disk` (the document in column `--text-field`, a record batch at a time), or
`-` (lines of standard input, read as bytes and decoded here).

A document's text comes as pieces cut just before a whitespace character where the text
has one, so that tokenizing the pieces one by one gives the tokens of the whole text for
tokenizers that split words at whitespace (byte-level BPE, word-level, SentencePiece's
metaspace). A `.jsonl` line is parsed whole, so it may be at most `JSON_LINE_LIMIT` bytes.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import json
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from hookdump.errors import HookdumpError, opt, printable
from hookdump.inputs.tables import TABLE_SUFFIXES, record_batches, table_files

PIECE = 1 << 18  # bytes read at a time, and about the characters of a piece of text
JSON_LINE_LIMIT = 64 << 20
DEFLATE_RATIO = 1032
_LAST_SPACE = re.compile(r"\s\S*\Z")


@dataclass
class ReadProgress:
    """How far the reading got, for an estimate of a corpus's samples before they are all
    made: the corpus's bytes, the bytes read so far, the samples made from them."""

    corpus_bytes: int | None
    read: int = 0
    made: int = 0

    def count(self, samples: int) -> None:
        """`samples` more were made (or passed over) from what was read."""
        self.made += samples

    def estimate(self) -> int | None:
        """Samples in the whole corpus, extrapolated from those made so far."""
        if self.corpus_bytes is None or not self.read or not self.made:
            return None
        return max(self.made, round(self.made * self.corpus_bytes / self.read))


@dataclass
class Document:
    """A document: its sample id and its text in pieces. The pieces must be read (or left)
    before the next document is asked for; what is left is skipped unread by the caller."""

    id: str
    pieces: Iterator[str]


def _kind(path: Path) -> str:
    """`.txt` or `.jsonl` (also compressed: `x.jsonl.gz`), or another suffix."""
    return path.with_suffix("").suffix if path.suffix == ".gz" else path.suffix


def text_files(source: str) -> list[Path]:
    """The corpus files `source` names (none for standard input)."""
    if source == "-":
        return []
    path = Path(source)
    if path.is_dir():
        found = table_files(path, "text") or sorted(
            p for p in path.rglob("*.txt*") if p.is_file() and _kind(p) == ".txt"
        )
        if not found:
            raise HookdumpError(
                f"{opt('text')} {source}: no .txt files, parquet shards or saved datasets "
                "folder here"
            )
        return found
    if not path.is_file():
        raise HookdumpError(f"{opt('text')} {source}: no such file or folder")
    if _kind(path) not in (".txt", ".jsonl", ".parquet"):
        raise HookdumpError(
            f"{opt('text')} {source} is not a .txt, .jsonl or .parquet file (or .txt.gz, "
            ".jsonl.gz), a folder of .txt files or parquet shards, a saved datasets folder, or -"
        )
    return [path]


def corpus_kind(source: str) -> str:
    """What `--text` names, for the manifest: `stdin`, `txt`, `jsonl` (either may end in
    `.gz`), `parquet`, `datasets` (a folder saved with `save_to_disk`), or a folder of
    `txt` files or `parquet` shards."""
    if source == "-":
        return "stdin"
    path = Path(source)
    if not path.is_dir():
        return _kind(path).lstrip(".") + (".gz" if path.suffix == ".gz" else "")
    if (path / "state.json").is_file():
        return "datasets"
    files = text_files(source)
    return "folder of parquet" if files and files[0].suffix == ".parquet" else "folder of txt"


def content_bytes(path: Path) -> int:
    """The bytes a corpus file holds once read: its size, a gzip file's own record of its
    uncompressed size (modulo 4 GiB, as gzip keeps it: an estimate's input only), or a
    parquet file's uncompressed column data."""
    size = path.stat().st_size
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq

            meta = pq.ParquetFile(path).metadata
            groups = (meta.row_group(i) for i in range(meta.num_row_groups))
            return sum(g.total_byte_size for g in groups) or size
        except Exception:  # an estimate only: the file's own size will do
            return size
    if path.suffix != ".gz" or size < 4:
        return size
    with path.open("rb") as handle:
        handle.seek(-4, 2)
        recorded = int.from_bytes(handle.read(4), "little")
    # deflate packs at most 1032 bytes into one: more is not a trailer (a cut file's bytes)
    return recorded if 0 < recorded <= DEFLATE_RATIO * size else size


def documents(
    source: str, text_field: str, progress: ReadProgress | None = None, chat: bool = False
) -> Iterator[Document]:
    """The documents of `source` in corpus order, read as needed; `progress` counts the
    bytes read. `chat`: each `.jsonl` line's `text_field` is a conversation, a list of
    `{"role", "content"}` messages, given as one piece, its JSON (`inputs.chat`)."""
    progress = progress or ReadProgress(None)
    if source == "-":
        yield from _lines(sys.stdin.buffer, "-", chat, text_field, progress, chat)
        return
    path = Path(source)
    files = text_files(source)
    if chat and (path.is_dir() or _kind(path) != ".jsonl"):
        raise HookdumpError(
            f"{opt('chat', True)} reads conversations from a .jsonl file (a line per "
            f"conversation, its messages in the field {text_field!r}); {source} is not one"
        )
    if files and files[0].suffix in TABLE_SUFFIXES:
        for file in files:
            yield from _table_documents(file, text_field, progress)
        return
    if path.is_dir():
        for file in files:
            with _open(file) as handle:
                reader = _Reader(handle, progress, whole=True, name=str(file))
                for chunks in reader.lines():
                    yield Document(str(file), _cut(_decoded(chunks, str(file), strip=False)))
        return
    with _open(path) as handle:
        yield from _lines(handle, str(path), _kind(path) == ".jsonl", text_field, progress, chat)


def _table_documents(path: Path, field: str, progress: ReadProgress) -> Iterator[Document]:
    """The documents in column `field` of a parquet file or an arrow stream (a `datasets`
    shard), a record batch at a time: each string as it is (an empty one too, as in a
    `.jsonl`); missing values are skipped."""
    import pyarrow as pa

    row = 0
    for batch in record_batches(path, [field], "text"):
        kind = batch.schema.field(0).type
        if not (
            pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"
        ):
            raise HookdumpError(
                f"{opt('text')} {path}: column {field!r} is {kind}, not text; choose a column "
                f"of strings with {opt('text_field')}"
            )
        progress.read += batch.nbytes
        for value in batch.column(0).to_pylist():
            row += 1
            if isinstance(value, str):
                yield Document(f"{path}#{row}", _cut(_split(value)))


def _open(path: Path) -> BinaryIO:
    """The file's bytes (a `.gz` file's decompressed, as they are read)."""
    try:
        if path.suffix == ".gz":
            return gzip.open(path, "rb")  # type: ignore[return-value]
        return path.open("rb")
    except OSError as exc:
        raise HookdumpError(f"{opt('text')}: cannot read {path} ({exc.strerror})") from None


def _lines(
    handle: BinaryIO,
    name: str,
    jsonl: bool,
    field: str,
    progress: ReadProgress,
    chat: bool = False,
) -> Iterator[Document]:
    for number, chunks in enumerate(_Reader(handle, progress, name=name).lines(), start=1):
        where = f"{name}:{number}"
        if jsonl:
            text = _json_document(chunks, where, field, chat)
            if text is not None:
                yield Document(where, iter([text]) if chat else _cut(_split(text)))
            continue
        pieces = _unless_blank(_cut(_decoded(chunks, where, strip=True)))
        if pieces is not None:
            yield Document(where, pieces)


class _Reader:
    """A binary stream as lines (`whole`: as one text), each line as chunks of at most
    `PIECE` bytes; a line's unread chunks are skipped when the next line is asked for."""

    def __init__(
        self, handle: BinaryIO, progress: ReadProgress, whole: bool = False, name: str = ""
    ) -> None:
        self._handle, self._progress, self._whole = handle, progress, whole
        self._ended = False
        self._name = name or getattr(handle, "name", "the corpus")

    def lines(self) -> Iterator[Iterator[bytes]]:
        while first := self._read():
            line = self._line(first)
            yield line
            for _ in line:  # what the caller left unread
                pass

    def _line(self, chunk: bytes) -> Iterator[bytes]:
        while chunk:
            yield chunk
            if not self._whole and chunk.endswith(b"\n"):
                return
            chunk = self._read()

    def _read(self) -> bytes:
        if self._ended:
            return b""
        read = self._handle.read if self._whole else self._handle.readline
        try:
            chunk = read(PIECE)
        except (EOFError, OSError, zlib.error) as exc:  # a cut or damaged gzip file, say
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise HookdumpError(
                f"{opt('text')}: cannot read {printable(str(self._name))} ({reason}); "
                "check the file (gzip -t tests a .gz)"
            ) from None
        self._progress.read += len(chunk)
        self._ended = not chunk
        return chunk


def _decoded(chunks: Iterator[bytes], where: str, strip: bool) -> Iterator[str]:
    """The text of a line's chunks (`strip`: without its line break); invalid UTF-8 is one
    error naming the line."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    held = ""  # carriage returns that may turn out to end the line
    try:
        for chunk in chunks:
            text = held + decoder.decode(chunk)
            if strip:  # a line's last chunk ends with its line break; others may end in \r
                kept = text.rstrip("\r\n")
                held, text = text[len(kept) :], kept
            if text:
                yield text
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise HookdumpError(
            f"{opt('text')}: {where} is not UTF-8 text ({exc.reason}); fix or drop the line"
        ) from None


def _cut(pieces: Iterator[str]) -> Iterator[str]:
    """`pieces` re-cut just before their last run of whitespace, so that neither a word nor
    a run of whitespace is split between two pieces (a piece of more than twice `PIECE`
    characters with no whitespace is cut where it ends)."""
    carry = ""
    for piece in pieces:
        text = carry + piece
        space = _LAST_SPACE.search(text)
        at = space.start() if space else 0
        while at > 0 and text[at - 1].isspace():
            at -= 1
        if at == 0 and len(text) < 2 * PIECE:
            carry = text
            continue
        at = at or len(text)
        yield text[:at]
        carry = text[at:]
    if carry:
        yield carry


def _split(text: str) -> Iterator[str]:
    """A text already in memory (a `.jsonl` field, a table's string) in pieces of `PIECE`
    characters for `_cut`: the tokenizer never takes it whole."""
    for at in range(0, len(text), PIECE):
        yield text[at : at + PIECE]


def _unless_blank(pieces: Iterator[str]) -> Iterator[str] | None:
    """`pieces`, or None when they are whitespace only (a whitespace run past `PIECE`
    characters is taken as a document rather than read to its end)."""
    lead: list[str] = []
    size = 0
    for piece in pieces:
        lead.append(piece)
        size += len(piece)
        if piece.strip() or size > PIECE:
            return itertools.chain(lead, pieces)
    return None


def _json_document(chunks: Iterator[bytes], where: str, field: str, chat: bool) -> str | None:
    """The document of a `.jsonl` line (None for a blank line); `chat`: its conversation,
    checked, as JSON."""
    line = bytearray()
    for chunk in chunks:
        line += chunk
        if len(line) > JSON_LINE_LIMIT:
            raise HookdumpError(
                f"{opt('text')}: {where} is longer than {JSON_LINE_LIMIT >> 20} MiB, the most "
                "a .jsonl line may hold; split the document, or give it as a .txt line"
            )
    if not line.strip():
        return None
    try:
        value = json.loads(bytes(line))
    except (ValueError, RecursionError) as exc:
        reason = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise HookdumpError(f"{opt('text')}: {where} is not JSON ({reason})") from None
    text = value.get(field) if isinstance(value, dict) else None
    if chat:
        return json.dumps(_messages(text, where, field))
    if not isinstance(text, str):
        raise HookdumpError(
            f"{opt('text')}: {where} has no string field {field!r}; choose the field with "
            f"{opt('text_field')}"
        )
    return text


def _messages(value: Any, where: str, field: str) -> list[dict[str, str]]:
    """A conversation: a non-empty list of messages, each a `role` and a `content` string
    (or a list of text parts, `{"type": "text", "text": ...}`, joined)."""
    ok = isinstance(value, list) and bool(value)
    ok = ok and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value)
    if not ok:
        raise HookdumpError(
            f"{opt('text')}: {where} has no conversation in {field!r} (a list of "
            f'{{"role": ..., "content": ...}} messages); choose the field with {opt("text_field")}'
        )
    return [
        {"role": m["role"], "content": _content(m.get("content"), where, n)}
        for n, m in enumerate(value)
    ]


def _content(content: Any, where: str, index: int) -> str:
    """A message's text: its content string, or its text parts joined."""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else None
    if parts is not None and all(isinstance(p, dict) for p in parts):
        kinds = [p.get("type") for p in parts]
        other = [k for k in kinds if k != "text"]
        if not other and all(isinstance(p.get("text"), str) for p in parts):
            return "".join(p["text"] for p in parts)
        if other:
            raise HookdumpError(
                f"{opt('text')}: message {index} of {where} has a part of type "
                f"{printable(repr(other[0]))[:40]}; {opt('chat', True)} reads text only "
                '(content as a string, or parts {"type": "text", "text": ...})'
            )
    raise HookdumpError(
        f"{opt('text')}: message {index} of {where} has no text content (a string, or a "
        'list of {"type": "text", "text": ...} parts)'
    )
