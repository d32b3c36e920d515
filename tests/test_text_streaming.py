"""A corpus is read and tokenized in bounded pieces: the tokens are those of the whole
documents, and memory stays bounded for a line of any length, with or without newlines.

References: the tokenizer run on each whole document, as a user would."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import assert_usage_error, invoke, memory_limited
from tiny_text import CORPUS, tiny_bpe_gpt2

import hookdump
from hookdump.inputs import corpus as corpus_module

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.usefixtures("in_tests_dir"), pytest.mark.slow]  # run with --heavy

# long documents with words, runs of mixed whitespace, CRLF, and characters of 2 to 4 bytes
# that the small pieces below cut through
DOCS = [
    "  ".join(CORPUS[i % 5] or "park" for i in range(40)),
    "the cat\tsat   on the mat é€ 😀 " * 30,
    "hooks dump activations\t\x0c of the " + "the  cat sat " * 20,
    "a dog ran\r",
    "  \t  ",  # blank: not a document
    "",
    "the park",
]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer: GPT-2's kind, where spaces belong to the next word."""
    return tiny_bpe_gpt2(tmp_path_factory.mktemp("bpe"), CORPUS + DOCS, vocab_size=400)


def _whole_documents() -> list[str]:
    return [d.rstrip("\r") for d in DOCS if d.strip()]


@pytest.mark.parametrize("piece", [6, 64, 1 << 18])  # 6: no word is longer than 12
@pytest.mark.parametrize("model", ["bpe", "gpt2"])  # byte-level BPE, word-level
def test_packed_pieces_give_the_tokens_of_whole_documents(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    piece: int, model: str,
) -> None:  # fmt: skip
    folder = request.getfixturevalue(model)
    monkeypatch.setattr(corpus_module, "PIECE", piece)
    path = tmp_path / "long.txt"
    path.write_bytes(("\n".join(DOCS) + "\n").replace("\r\n", "\r\r\n").encode())
    out = tmp_path / "d"
    result = invoke("run", f"hf:{folder}", "--text", str(path), "--context-size", "16",
                    "-l", "h.0", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    eos = tokenizer.eos_token_id
    stream = [t for doc in _whole_documents()
              for t in [*tokenizer.encode(doc, add_special_tokens=False), eos]]  # fmt: skip
    windows = [[eos, *stream[i : i + 15]] for i in range(0, len(stream) - 14, 15)]
    assert hookdump.load(out)["__input_ids__"].tolist() == windows


@pytest.mark.parametrize("piece", [6, 1 << 18])
def test_a_document_sample_is_the_truncated_head_of_the_whole(
    bpe: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int
) -> None:
    monkeypatch.setattr(corpus_module, "PIECE", piece)
    path = tmp_path / "long.txt"
    path.write_text("\n".join(DOCS) + "\n")
    out = tmp_path / "d"
    result = invoke("run", f"hf:{bpe}", "--text", str(path), "--max-length", "24",
                    "-l", "h.0", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tokenizer = transformers.AutoTokenizer.from_pretrained(bpe)
    ref = tokenizer(_whole_documents(), truncation=True, max_length=24)["input_ids"]
    dump = hookdump.load(out)
    assert [len(ids) for ids in ref] == dump["__attention_mask__"].sum(1).tolist()
    assert [len(ids) for ids in ref][:3] == [24, 24, 24]  # the long ones were cut
    dumped = dump["__input_ids__"].tolist()
    assert [ids[: len(r)] for ids, r in zip(dumped, ref, strict=True)] == ref


def test_invalid_utf8_on_standard_input_is_one_line(gpt2: Path) -> None:
    import subprocess
    import sys

    process = subprocess.run(
        [sys.executable, "-m", "hookdump", "run", f"hf:{gpt2}", "--text", "-", "-q", "-o",
         "unused-out"],
        input=b"the cat\nsat \xff\xfe on\n", capture_output=True, cwd=Path(__file__).parent,
    )  # fmt: skip
    assert process.returncode == 2, process.stderr
    assert process.stderr.decode().startswith("Error: --text: -:2 is not UTF-8 text")
    assert len(process.stderr.decode().strip().splitlines()) == 1


def test_a_jsonl_line_past_the_limit_is_one_line(
    gpt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(corpus_module, "JSON_LINE_LIMIT", 1000)
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "the cat"}\n{"text": "' + "a " * 600 + '"}\n')
    assert_usage_error(invoke("run", f"hf:{gpt2}", "--text", str(path), "-q", "-o",
                              str(tmp_path / "d")),
                       f"{path}:2 is longer than", "split the document")  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode", [["--context-size", "16"], ["--max-length", "16"], ["--per-token", "--max-length", "9"]]
)
def test_one_huge_line_is_read_in_bounded_memory(
    bpe: Path, tmp_path: Path, mode: list[str]
) -> None:
    """40 MB in one line without a newline: the old reader held it whole, and the tokenizer
    took gigabytes; now the child may grow by 600 MiB at most."""
    path = tmp_path / "huge.txt"
    with path.open("w") as handle:
        for _ in range(40):
            handle.write("the cat sat on the mat é " * 40_000)  # 1 MB
    out = tmp_path / "d"
    args = ["run", f"hf:{bpe}", "--text", str(path), *mode, "-n", "2", "-l", "h.0", "-q"]
    code, _, stderr = memory_limited(*args, "-o", str(out), headroom=600 << 20)
    assert code == 0, stderr
    dump = hookdump.load(out)
    assert dump.sample_ids[:1] in ([0], [f"{path}:1"])


@pytest.mark.slow
def test_standard_input_of_zeros_is_read_in_bounded_memory(gpt2: Path, tmp_path: Path) -> None:
    """`--text - < /dev/zero`: one endless line of NUL characters, packed into windows."""
    out = tmp_path / "d"
    with open("/dev/zero", "rb") as zeros:
        code, _, stderr = memory_limited("run", f"hf:{gpt2}", "--text", "-", "--context-size",
                                         "4", "-n", "2", "-l", "h.0", "-q", "-o", str(out),
                                         headroom=600 << 20, stdin=zeros.fileno())  # fmt: skip
    assert code == 0, stderr
    assert hookdump.load(out).num_samples == 2


def test_a_long_jsonl_or_table_document_reaches_the_tokenizer_in_pieces(tmp_path: Path) -> None:
    """N8 (issue 32): a string already in memory is cut like a line read from a file, so the
    tokenizer never takes it whole; the pieces join back into the document."""
    import json

    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    text = "the cat sat on the mat " * 60_000  # 1.4 MB
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": text}) + "\n")
    pq.write_table(pa.table({"text": [text]}), tmp_path / "c.parquet")
    for name in ("c.jsonl", "c.parquet"):
        (document,) = list(corpus_module.documents(str(tmp_path / name), "text"))
        pieces = list(document.pieces)
        assert len(pieces) > 2 and "".join(pieces) == text
        assert max(map(len, pieces)) <= 2 * corpus_module.PIECE


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_huge_jsonl_or_parquet_document_is_tokenized_in_bounded_memory(
    bpe: Path, tmp_path: Path, kind: str
) -> None:
    """A 20 MB document in one .jsonl field or parquet string: about 3 GB in the tokenizer
    when taken whole; now the child may grow by 600 MiB at most."""
    import json

    text = "the cat sat on the mat " * 900_000
    path = tmp_path / f"big.{kind}"
    if kind == "jsonl":
        path.write_text(json.dumps({"text": text}) + "\n" + json.dumps({"text": "short"}) + "\n")
    else:
        pq = pytest.importorskip("pyarrow.parquet")
        pa = pytest.importorskip("pyarrow")
        pq.write_table(pa.table({"text": [text, "short"]}), path)
    args = ["run", f"hf:{bpe}", "--text", str(path), "--context-size", "16", "-n", "2",
            "-l", "h.0", "-q", "-o", str(tmp_path / "d")]  # fmt: skip
    code, _, stderr = memory_limited(*args, headroom=600 << 20)
    assert code == 0, stderr
    assert hookdump.load(tmp_path / "d").num_samples == 2


@pytest.mark.parametrize("damage", ["cut", "trailing", "not_gzip"])
def test_a_damaged_gzip_corpus_is_one_error_line(gpt2: Path, tmp_path: Path, damage: str) -> None:
    """N11 (issue 32): gzip's EOFError and BadGzipFile used to reach Click ("Aborted!",
    exit 1) or print a traceback."""
    import gzip

    plain = ("\n".join(CORPUS * 20) + "\n").encode()
    packed = gzip.compress(plain)
    data = {"cut": packed[: len(packed) // 2], "trailing": packed + b"garbage trailing\n",
            "not_gzip": plain}[damage]  # fmt: skip
    path = tmp_path / "c.txt.gz"
    path.write_bytes(data)
    result = invoke("run", f"hf:{gpt2}", "--text", str(path), "--context-size", "8", "-q",
                    "-l", "h.0")  # fmt: skip
    assert_usage_error(result, "--text: cannot read", "c.txt.gz")


def test_a_cut_gzip_file_does_not_inflate_the_size_estimate(tmp_path: Path) -> None:
    import gzip

    packed = gzip.compress(b"the quick brown fox jumps over the lazy dog\n" * 20_000)
    path = tmp_path / "c.txt.gz"
    for cut in range(len(packed) * 9 // 10, len(packed) * 9 // 10 + 40):
        path.write_bytes(packed[:cut])  # the last 4 bytes are not a size: deflate data
        assert corpus_module.content_bytes(path) <= 1032 * cut
