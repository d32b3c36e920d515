"""`--text` reads gzip-compressed corpora (`.txt.gz`, `.jsonl.gz`, and `.txt.gz` files in a
folder) as they are read, giving the documents and the dump the plain files give."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from clitools import invoke

import hookdump
from hookdump.inputs.corpus import content_bytes, documents


def _texts(source: Path, field: str = "text") -> list[tuple[str, str]]:
    return [(d.id.split("/")[-1], "".join(d.pieces)) for d in documents(str(source), field)]


def test_compressed_files_give_the_documents_of_the_plain_ones(tmp_path: Path) -> None:
    lines = ["one document", "", "a second  one, with  spaces", "é and ünïcode " * 50_000]
    plain = tmp_path / "c.txt"
    plain.write_text("\n".join(lines) + "\n")
    packed = tmp_path / "c.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert [t for _, t in _texts(packed)] == [t for _, t in _texts(plain)]
    assert content_bytes(packed) == plain.stat().st_size  # for the samples' estimate
    rows = tmp_path / "c.jsonl.gz"
    rows.write_bytes(gzip.compress(b"".join(json.dumps({"body": t}).encode() + b"\n"
                                            for t in lines if t)))  # fmt: skip
    assert [t for _, t in _texts(rows, "body")] == [t for t in lines if t]
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("first file")
    (folder / "b.txt.gz").write_bytes(gzip.compress(b"second file"))
    (folder / "c.bin").write_bytes(b"not text")
    assert [t for _, t in _texts(folder)] == ["first file", "second file"]


def test_a_compressed_corpus_dumps_as_the_plain_one(
    tmp_path: Path, gpt2: Path, corpus: Path
) -> None:
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(corpus.read_bytes()))
    dumps = {}
    for name, source in (("plain", corpus), ("gz", packed)):
        out = tmp_path / name
        args = ["run", f"hf:{gpt2}", "--text", str(source), "--context-size", "8", "-l", "h.0",
                "--per-token", "-q", "-o", str(out)]  # fmt: skip
        result = invoke(*args)
        assert result.exit_code == 0, result.stderr
        dumps[name] = hookdump.load(out)
    assert dumps["gz"]["__token_ids__"].tolist() == dumps["plain"]["__token_ids__"].tolist()
    assert dumps["gz"].num_samples == dumps["plain"].num_samples > 0


def test_other_files_are_still_refused_in_one_line(tmp_path: Path) -> None:
    from hookdump.errors import HookdumpError

    odd = tmp_path / "c.csv.gz"
    odd.write_bytes(gzip.compress(b"a,b"))
    with pytest.raises(
        HookdumpError, match=r"is not a \.txt, \.jsonl or \.parquet file \(or \.txt\.gz"
    ):
        list(documents(str(odd), "text"))
