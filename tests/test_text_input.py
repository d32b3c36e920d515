"""`--text`: corpora tokenized with the model folder's tokenizer, packed into windows or one
document per sample, and the ids (and mask) fed stored in the dump.

References are computed here from the tokenizer and the model run directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from tiny_text import CORPUS, ctrl_c_in_batch, tiny_bert, tiny_bpe_gpt2

import hookdump

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_tests_dir")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"), max_position_embeddings=12)


def _packed_reference(folder: Path, size: int, bos: bool) -> torch.Tensor:
    """The contract's packing, written out: documents without special tokens, EOS after
    each, windows of BOS (here EOS: the tokenizer has no BOS) + size - 1 tokens."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    eos = tokenizer.eos_token_id
    stream = [
        t for doc in CORPUS if doc for t in [*tokenizer.encode(doc, add_special_tokens=False), eos]
    ]
    take = size - 1 if bos else size
    windows = [stream[i : i + take] for i in range(0, len(stream) - take + 1, take)]
    return torch.tensor([([eos] if bos else []) + w for w in windows])


@pytest.mark.parametrize("bos", [True, False])
def test_packed_windows_feed_the_model(gpt2: Path, corpus: Path, tmp_path: Path, bos: bool) -> None:
    out = tmp_path / "d"
    args = ["run", f"hf:{gpt2}", "--text", str(corpus), "--context-size", "6", "-l", "h.0",
            "-b", "2", "-q", "-o", str(out)] + ([] if bos else ["--no-bos"])  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    expected = _packed_reference(gpt2, 6, bos)
    assert torch.equal(dump["__input_ids__"], expected)
    assert "__attention_mask__" not in dump  # packed: all ones
    assert dump.manifest.tensors["__input_ids__"]["kind"] == "tokens"
    assert "sample_ids" not in dump.manifest  # window numbers
    assert dump.sample_ids == list(range(len(expected)))
    model = transformers.GPT2Model.from_pretrained(gpt2).eval()
    with torch.no_grad():
        hidden = model(input_ids=expected, output_hidden_states=True).hidden_states
    torch.testing.assert_close(dump["h.0"], hidden[1])


def test_one_document_per_sample_is_padded_with_its_mask(bert: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "docs.jsonl"
    lines = [json.dumps({"body": d}) if d else "" for d in CORPUS]
    corpus.write_text("\n".join(lines) + "\n")
    out = tmp_path / "d"
    result = invoke("run", f"hf:{bert}", "--text", str(corpus), "--text-field", "body",
                    "-l", "encoder.layer.0", "-b", "3", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)
    docs = [d for d in CORPUS if d]
    ref = tokenizer(docs, padding="max_length", truncation=True, max_length=12,
                    return_tensors="pt")  # fmt: skip
    assert torch.equal(dump["__input_ids__"], ref["input_ids"])
    assert torch.equal(dump["__attention_mask__"], ref["attention_mask"])
    assert dump["__input_ids__"][0, 0] == tokenizer.cls_token_id  # its own special tokens
    assert dump.manifest["sample_ids"] == [f"{corpus}:{n}" for n in (1, 3, 4, 5)]  # blank: 2
    model = transformers.BertModel.from_pretrained(bert).eval()
    with torch.no_grad():
        hidden = model(**ref, output_hidden_states=True).hidden_states
    torch.testing.assert_close(dump["encoder.layer.0"], hidden[1])


def test_folders_stdin_and_limits(gpt2: Path, tmp_path: Path) -> None:
    folder = tmp_path / "texts"
    (folder / "b").mkdir(parents=True)
    (folder / "a.txt").write_text("the cat sat")
    (folder / "b" / "c.txt").write_text("the dog ran in the park")
    out = tmp_path / "folder"
    args = ["run", f"hf:{gpt2}", "-l", "h.0", "-q", "--max-length", "8"]
    assert invoke(*args, "--text", str(folder), "-o", str(out)).exit_code == 0
    assert hookdump.load(out).manifest["sample_ids"] == [str(folder / "a.txt"),
                                                        str(folder / "b" / "c.txt")]  # fmt: skip
    out = tmp_path / "stdin"
    result = invoke(*args, "--text", "-", "-n", "2", "-o", str(out), input="a\n\nb\nc\n")
    assert result.exit_code == 0, result.stderr
    assert hookdump.load(out).manifest["sample_ids"] == ["-:1", "-:3"]
    out = tmp_path / "budget"
    result = invoke(*args, "--text", "-", "--max-tokens", "20", "-o", str(out), input="a\nb\nc\n")
    assert hookdump.load(out).num_samples == 2  # 8 tokens each, padding included


def test_text_errors_are_one_line(gpt2: Path, corpus: Path, tmp_path: Path) -> None:
    assert_usage_error(invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--input",
                              "x.npy"), "give --text or --input, not both")  # fmt: skip
    assert_usage_error(invoke("run", "tiny_models:Tokens", "--text", str(corpus)),
                       "--text needs a tokenizer", "--tokenizer PATH")  # fmt: skip
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{oops\n')
    assert_usage_error(invoke("run", f"hf:{gpt2}", "--text", str(bad), "-q"),
                       f"{bad}:2 is not JSON")  # fmt: skip
    bad.write_text('{"body": "ok"}\n')
    assert_usage_error(invoke("run", f"hf:{gpt2}", "--text", str(bad), "-q"),
                       f"{bad}:1 has no string field 'text'", "--text-field")  # fmt: skip
    assert_usage_error(invoke("run", f"hf:{gpt2}", "--text", str(tmp_path / "none.txt")),
                       "no such file or folder")  # fmt: skip


@pytest.mark.parametrize("shard_size", ["1GiB", "2000"])  # 2000: batches overflow shards
def test_per_token_rows_are_the_real_tokens(
    gpt2: Path, corpus: Path, tmp_path: Path, shard_size: str
) -> None:
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(corpus), "--max-length", "9",
                    "--per-token", "-l", "h.0", "-b", "1", "--shard-size", shard_size,
                    "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)
    docs = [d for d in CORPUS if d]
    tokenizer.pad_token = tokenizer.eos_token
    ref = tokenizer(docs, padding="max_length", truncation=True, max_length=9,
                    return_tensors="pt")  # fmt: skip
    real = ref["attention_mask"].bool()
    model = transformers.GPT2Model.from_pretrained(gpt2).eval()
    with torch.no_grad():
        hidden = model(**ref, output_hidden_states=True).hidden_states[1]
    dump = hookdump.load(out)
    assert dump.num_samples == int(real.sum()) and dump.manifest["num_sequences"] == 4
    assert dump.manifest["rows"] == "tokens"
    torch.testing.assert_close(dump["h.0"], hidden[real])  # padding rows dropped
    assert torch.equal(dump["__token_ids__"], ref["input_ids"][real])
    samples, positions = real.nonzero(as_tuple=True)
    assert torch.equal(dump["__sample__"], samples)
    assert torch.equal(dump["__position__"], positions)
    assert "__input_ids__" not in dump and "__attention_mask__" not in dump
    # one document a batch, padded to its own length: every position computed is real
    computed = "(100% of the positions computed were real tokens)"
    assert f"{int(real.sum())} tokens from 4 sequences {computed} in" in result.stdout
    inspected = invoke("inspect", str(out))
    shards = len(dump.manifest.shards)
    assert f"{int(real.sum())} tokens from 4 sequences in {shards} shards" in inspected.stdout
    assert shards == (2 if shard_size == "1GiB" else 3)


def test_positions_and_special_tokens_select_rows(bert: Path, corpus: Path, tmp_path: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)
    docs = [d for d in CORPUS if d]
    lengths = [len(tokenizer(d)["input_ids"]) for d in docs]  # [CLS] ... [SEP]
    args = ["run", f"hf:{bert}", "--text", str(corpus), "--per-token", "-l",
            "encoder.layer.0", "-q"]  # fmt: skip
    out = tmp_path / "tail"
    assert invoke(*args, "--positions", "-2:", "-o", str(out)).exit_code == 0
    dump = hookdump.load(out)
    expected = [p for n in lengths for p in (n - 2, n - 1)]
    assert dump["__position__"].tolist() == expected  # the last two real tokens of each
    out = tmp_path / "plain"
    assert (
        invoke(*args, "--skip-special-tokens", "--positions", "1:", "-o", str(out)).exit_code == 0
    )
    ids = hookdump.load(out)["__token_ids__"].tolist()
    assert set(ids).isdisjoint(tokenizer.all_special_ids)
    assert len(ids) == sum(n - 2 for n in lengths)  # no [CLS], no [SEP]


def test_per_token_errors_are_one_line(gpt2: Path, corpus: Path) -> None:
    assert_usage_error(invoke("run", "tiny_models:Tokens", "--per-token"),
                       "--per-token needs text input: --text")  # fmt: skip
    base = ["run", f"hf:{gpt2}", "--text", str(corpus), "--per-token"]
    assert_usage_error(invoke(*base, "--positions", "1-2"), "--positions '1-2' is not START:STOP")
    assert_usage_error(invoke(*base, "--reduce", "mean"), "--reduce mean reduces the tokens")
    # position embeddings are [1, T, D]: nothing per token of each sample
    line = assert_usage_error(invoke(*base, "-l", "wpe", "-b", "2"))
    assert "--per-token: 'wpe' captured nothing shaped [batch, tokens, ...]" in line


def test_reductions_of_text_take_real_tokens_only(bert: Path, corpus: Path, tmp_path: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert)
    docs = [d for d in CORPUS if d]
    ref = tokenizer(docs, padding="max_length", truncation=True, max_length=12,
                    return_tensors="pt")  # fmt: skip
    model = transformers.BertModel.from_pretrained(bert).eval()
    with torch.no_grad():
        hidden = model(**ref, output_hidden_states=True).hidden_states[1]
    real = ref["attention_mask"].bool()
    lengths = real.sum(1)
    expected = {
        "mean": torch.stack([hidden[i, : lengths[i]].mean(0) for i in range(len(docs))]),
        "max": torch.stack([hidden[i, : lengths[i]].amax(0) for i in range(len(docs))]),
        "first": hidden[:, 0],
        "last": torch.stack([hidden[i, lengths[i] - 1] for i in range(len(docs))]),
    }
    for how, value in expected.items():
        out = tmp_path / how
        result = invoke("run", f"hf:{bert}", "--text", str(corpus), "-l", "encoder.layer.0",
                        "--reduce", how, "-b", "2", "-q", "-o", str(out))  # fmt: skip
        assert result.exit_code == 0, result.stderr
        torch.testing.assert_close(hookdump.load(out)["encoder.layer.0"], value, msg=how)


def test_an_interrupted_text_dump_resumes_to_the_same_dump(
    gpt2: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["run", f"hf:{gpt2}", "--text", str(corpus), "--context-size", "4", "-l", "h.0",
            "-b", "2", "--shard-size", "1", "-q"]  # fmt: skip
    whole, out = tmp_path / "whole", tmp_path / "resumed"
    assert invoke(*args, "-o", str(whole)).exit_code == 0
    ctrl_c_in_batch(monkeypatch, 3)
    assert invoke(*args, "-o", str(out)).exit_code == 130
    monkeypatch.undo()
    assert hookdump.load(out).num_samples == 4
    result = invoke(*args, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    assert invoke("diff", str(whole), str(out), "--atol", "0", "--rtol", "0").exit_code == 0
    assert hookdump.load(out).sample_ids == hookdump.load(whole).sample_ids


def test_every_source_form_gives_the_same_ids(gpt2: Path, tmp_path: Path) -> None:
    docs = [d for d in CORPUS if d]
    (tmp_path / "c.txt").write_text("\n".join(docs) + "\n")
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, doc in enumerate(docs):
        (folder / f"{i}.txt").write_text(doc)
    ids = {}
    for name, source, stdin in (("txt", tmp_path / "c.txt", None),
                                ("jsonl", tmp_path / "c.jsonl", None),
                                ("folder", folder, None),
                                ("stdin", "-", "\n".join(docs) + "\n")):  # fmt: skip
        out = tmp_path / name
        result = invoke("run", f"hf:{gpt2}", "--text", str(source), "--context-size", "5",
                        "-l", "h.0", "-q", "-o", str(out), input=stdin)  # fmt: skip
        assert result.exit_code == 0, (name, result.stderr)
        ids[name] = hookdump.load(out)["__input_ids__"]
    for name in ("jsonl", "folder", "stdin"):
        assert torch.equal(ids[name], ids["txt"]), name


def test_per_token_on_a_pooler_is_refused(bert: Path, corpus: Path) -> None:
    line = assert_usage_error(invoke("run", f"hf:{bert}", "--text", str(corpus), "--per-token",
                                     "-l", "pooler"))  # fmt: skip
    assert "'pooler' captured nothing shaped [batch, tokens, ...] (it gave shape [4, 32])" in line


def test_an_interrupted_per_token_dump_resumes_to_the_same_dump(
    gpt2: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["run", f"hf:{gpt2}", "--text", str(corpus), "--max-length", "9", "--per-token",
            "-l", "h.0", "-b", "2", "--shard-size", "1", "-q"]  # fmt: skip
    whole, out = tmp_path / "whole", tmp_path / "resumed"
    assert invoke(*args, "-o", str(whole)).exit_code == 0
    ctrl_c_in_batch(monkeypatch, 2)
    assert invoke(*args, "-o", str(out)).exit_code == 130
    monkeypatch.undo()
    partial = hookdump.load(out)
    assert partial.manifest["num_sequences"] == 2 and not partial.complete
    result = invoke(*args, "-o", str(out), "--resume")
    assert result.exit_code == 0, result.stderr
    assert invoke("diff", str(whole), str(out), "--atol", "0", "--rtol", "0").exit_code == 0
    a, b = hookdump.load(whole), hookdump.load(out)
    assert (b.num_samples, b.manifest["num_sequences"]) == (a.num_samples, 4)
    assert b.sample_ids == a.sample_ids
    assert torch.equal(b["__sample__"], a["__sample__"])


def test_a_byte_level_bpe_gpt2_without_a_pad_token(tmp_path: Path) -> None:
    """GPT-2's usual setup: byte-level BPE, no pad token (padding is EOS, which may also be a
    real token): token rows follow the mask, never the id."""
    folder = tiny_bpe_gpt2(tmp_path / "gpt2-bpe", CORPUS, vocab_size=300)
    fast = transformers.AutoTokenizer.from_pretrained(folder)
    corpus = tmp_path / "c.txt"
    docs = [d for d in CORPUS if d] + ["ends with <|endoftext|>"]  # EOS as a real token
    corpus.write_text("\n".join(docs) + "\n")
    out = tmp_path / "d"
    result = invoke("run", str(folder), "--text", str(corpus), "--per-token", "-l", "h.0",
                    "--max-length", "64", "-q", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    real = [fast(d)["input_ids"] for d in docs]
    dump = hookdump.load(out)
    assert dump["__token_ids__"].tolist() == [t for ids in real for t in ids]
    assert fast.eos_token_id in dump["__token_ids__"].tolist()  # the real one is kept
    assert dump.num_samples == sum(map(len, real))  # and no padding row


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("limit", [[], ["--num-samples", "7"], ["--max-tokens", "40"]])
def test_ranks_slices_of_the_text_join_into_the_whole(
    gpt2: Path, tmp_path: Path, packed: bool, limit: list[str]
) -> None:
    """What each torchrun rank feeds (`share`), joined in rank order, is what one process
    feeds: the same sample ids and token ids, with or without a limit."""
    from hookdump.inputs.text import TextOptions, text_feed

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS * 3) + "\n")
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)
    options = TextOptions(
        str(corpus), context_size=5 if packed else None, max_length=None if packed else 8,
        max_tokens=40 if "--max-tokens" in limit else None,
    )  # fmt: skip
    num_samples = 7 if "--num-samples" in limit else None

    def fed(share: tuple[int, int] | None) -> tuple[list[object], list[list[int]], int]:
        feed = text_feed(options, tokenizer, num_samples=num_samples, share=share)
        batches = list(feed.batches(3))
        ids = [row for b in batches for row in b.kwargs["input_ids"].tolist()]
        return [i for b in batches for i in b.ids], ids, feed.first

    whole_ids, whole_tokens, _ = fed(None)
    parts = [fed((rank, 3)) for rank in range(3)]
    assert [i for p in parts for i in p[0]] == whole_ids
    assert [t for p in parts for t in p[1]] == whole_tokens
    assert [p[2] for p in parts] == [0, len(parts[0][0]), len(parts[0][0]) + len(parts[1][0])]
    allowed = {"--num-samples": 7, "--max-tokens": 40 // (5 if packed else 8)}
    stream = sum(len(tokenizer.encode(d, add_special_tokens=False)) + 1 for d in CORPUS * 3 if d)
    corpus_samples = stream // 4 if packed else 12  # windows of BOS + 4, or documents
    assert len(whole_ids) == (allowed[limit[0]] if limit else corpus_samples)


def test_standard_input_under_torchrun_is_refused(gpt2: Path) -> None:
    from hookdump.inputs.text import TextOptions, text_feed

    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)
    with pytest.raises(hookdump.HookdumpError, match="every rank would read its own standard"):
        text_feed(TextOptions("-"), tokenizer, share=(0, 2))


def test_the_disk_estimate_of_token_rows_comes_from_the_corpus_size(
    gpt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No sample count is known ahead: the estimate extrapolates the first batch's bytes by
    the corpus's size, and refuses a dump the disk cannot hold before writing a shard."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS * 40) + "\n")
    args = ["run", f"hf:{gpt2}", "--text", str(corpus), "--context-size", "8", "--per-token",
            "-l", "h.*", "-b", "2"]  # fmt: skip
    result = invoke(*args, "-o", str(tmp_path / "a"), "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert 0.8 < report["estimated_bytes"] / report["total_bytes"] < 1.25

    import hookdump.store.write.area as area

    free = report["total_bytes"] // 2
    monkeypatch.setattr(area.shutil, "disk_usage", lambda _: type("U", (), {"free": free}))
    result = invoke(*args, "-o", str(tmp_path / "b"))
    assert_usage_error(result, "the dump needs about", "is free under --out")
    assert not (tmp_path / "b").exists()


def test_token_rows_of_a_known_count_fill_their_last_shard_exactly(
    gpt2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed windows of a known count make a known number of token rows: the shard that
    gathers the batches after the first is planned to that size, so it is never compacted
    (read back and written again) at the end."""
    import hookdump.store.write.shards as shards

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS * 5) + "\n")
    args = ["run", f"hf:{gpt2}", "--text", str(corpus), "--context-size", "6", "--per-token",
            "--positions", "1:", "-n", "9", "-l", "h.*", "-b", "2", "-q"]  # fmt: skip
    assert invoke(*args, "--shard-size", "1", "-o", str(tmp_path / "each")).exit_code == 0

    def compacting(*_: object) -> None:
        raise AssertionError("the last shard was compacted")

    monkeypatch.setattr(shards, "_move_down", compacting)
    result = invoke(*args, "-o", str(tmp_path / "planned"))
    assert result.exit_code == 0, result.stderr
    planned, each = hookdump.load(tmp_path / "planned"), hookdump.load(tmp_path / "each")
    assert [(s.start, s.stop) for s in planned.manifest.shards] == [(0, 10), (10, 45)]
    assert len(each.manifest.shards) == 5
    for key in each:
        assert torch.equal(planned[key], each[key]), key


@pytest.mark.parametrize("packed", [True, False])
def test_the_corpus_estimate_counts_what_was_passed_over(
    gpt2: Path, tmp_path: Path, packed: bool
) -> None:
    """Resuming (or a rank's slice) passes samples over: they were read, so the estimate of
    the corpus's samples counts them, and is exact once the whole corpus is read."""
    from hookdump.inputs.text import ReadProgress, TextOptions, samples

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(CORPUS * 3) + "\n")
    tokenizer = transformers.AutoTokenizer.from_pretrained(gpt2)
    options = TextOptions(str(corpus), context_size=5 if packed else None)
    whole = len(list(samples(options, tokenizer, None)))
    progress = ReadProgress(corpus.stat().st_size)
    rest = list(samples(options, tokenizer, None, first=6, progress=progress))
    assert len(rest) == whole - 6
    assert progress.estimate() == whole
