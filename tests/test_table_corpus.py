"""`--text` from parquet files, folders of parquet shards and `datasets` folders saved with
`save_to_disk`: the documents of the column `--text-field`, in order, as the `.jsonl` of the
same documents gives them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clitools import assert_usage_error, invoke

import hookdump
from hookdump.errors import HookdumpError
from hookdump.inputs.corpus import documents

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
DOCS = ["the first document", "", "a second, longer one " * 3000, "é ü ñ", "last"]


def _texts(source: Path, field: str = "text") -> list[str]:
    return ["".join(d.pieces) for d in documents(str(source), field)]


def test_parquet_files_shards_and_datasets_give_the_column_in_order(tmp_path: Path) -> None:
    expected = [d for d in DOCS]  # an empty string is a document, as in a .jsonl
    table = pa.table({"body": [*DOCS, None], "n": list(range(len(DOCS) + 1))})
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=2)
    assert _texts(tmp_path / "c.parquet", "body") == expected
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(table.slice(0, 3), shards / "part-0.parquet")
    pq.write_table(table.slice(3), shards / "part-1.parquet")  # the None is no document
    assert _texts(shards, "body") == expected
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": [*DOCS, None]}).save_to_disk(str(saved), num_shards=2)
    assert _texts(saved) == expected
    ids = [d.id for d in documents(str(tmp_path / "c.parquet"), "body")]
    assert ids[0].endswith("c.parquet#1") and ids[-1].endswith("c.parquet#5")  # row numbers


def test_a_parquet_corpus_dumps_as_the_jsonl_one(tmp_path: Path, gpt2: Path) -> None:
    rows = tmp_path / "c.jsonl"
    rows.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS[:2] + DOCS[3:]))
    pq.write_table(pa.table({"text": DOCS[:2] + DOCS[3:]}), tmp_path / "c.parquet")
    tokens = {}
    for source in (rows, tmp_path / "c.parquet"):
        out = tmp_path / source.suffix[1:]
        args = ["run", f"hf:{gpt2}", "--text", str(source), "--context-size", "8", "-l", "h.0",
                "--per-token", "-q", "-o", str(out)]  # fmt: skip
        result = invoke(*args)
        assert result.exit_code == 0, result.stderr
        tokens[source.suffix] = hookdump.load(out)["__token_ids__"].tolist()
    assert tokens[".parquet"] == tokens[".jsonl"] and tokens[".jsonl"]


def test_a_missing_column_is_one_line(tmp_path: Path, gpt2: Path) -> None:
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "c.parquet")
    with pytest.raises(HookdumpError, match="text_field 'text' is not a column of"):
        _texts(tmp_path / "c.parquet")
    line = assert_usage_error(
        invoke("run", f"hf:{gpt2}", "--text", str(tmp_path / "c.parquet")), "--text-field 'text'"
    )
    assert "its columns: body" in line


def test_the_manifest_records_the_corpus_and_no_random_input(tmp_path: Path, gpt2: Path) -> None:
    pq.write_table(pa.table({"body": DOCS}), tmp_path / "c.parquet")
    plain = tmp_path / "c.txt"
    plain.write_text("\n".join(DOCS) + "\n")
    for source, field, kind in ((tmp_path / "c.parquet", "body", "parquet"), (plain, None, "txt")):
        out = tmp_path / kind
        args = ["run", f"hf:{gpt2}", "--text", str(source), "--text-field", field or "text",
                "--context-size", "8", "-l", "h.0", "-q", "-o", str(out)]  # fmt: skip
        result = invoke(*args)
        assert result.exit_code == 0, result.stderr
        manifest = hookdump.load(out).manifest
        assert (manifest["input"]["kind"], manifest["input"]["field"]) == (kind, field)
        assert manifest["input"]["source"] == str(source)
        assert manifest["recipe"]["input"] is None and manifest["recipe"]["text"] == str(source)


@pytest.mark.parametrize(
    "column", [list(range(10)), [["a", "b"], ["c"]], [{"a": "x"}], [b"\xff\xfe", b"ok"]]
)
def test_a_text_column_that_is_not_strings_is_refused_naming_its_type(
    gpt2: Path, tmp_path: Path, column: list[object]
) -> None:
    """Issue 32 (CO18): such a column used to be "no document" in the corpus."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": column}), tmp_path / "c.parquet")
    result = invoke("run", f"hf:{gpt2}", "--text", str(tmp_path / "c.parquet"), "-l", "h.0",
                    "--max-length", "8", "-q")  # fmt: skip
    assert_usage_error(result, "column 'text' is", "not text", "--text-field")
