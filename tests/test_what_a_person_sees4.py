"""What a person sees, round 4 (issue 57): every line a run prints names its options as the
reader's door does (flags on the command line, arguments in Python), with no placeholder
left in it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

import hookdump
from hookdump.engine.progress import Progress
from hookdump.errors import opt, to_stderr


def _wait_line(notice: object) -> None:
    """The disk budget's own line, as `DiskBudget.wait` says it."""
    from test_hostile_round5 import _Writer  # a writer whose shard a follower consumes

    from hookdump.store.write.room import DiskBudget

    DiskBudget(10_000, notice).wait(_Writer(), 5_000, lambda: None)  # type: ignore[arg-type]


def test_the_wait_for_room_names_max_disk_on_the_command_line() -> None:
    from hookdump.cli._progress import progress_bar

    bar = progress_bar(False, "m")
    stream = io.StringIO()
    bar.console = Console(file=stream, width=80)
    _wait_line(bar.alert)
    said = stream.getvalue()
    assert "--max-disk 9.8 KiB" in " ".join(said.split()), said
    assert "\\x00" not in said and "\x00" not in said


def test_the_wait_for_room_names_max_disk_in_python(capsys: pytest.CaptureFixture[str]) -> None:
    _wait_line(to_stderr)
    said = capsys.readouterr().err
    assert "fill max_disk 9.8 KiB" in said and "\\x00" not in said, said
    quiet = Progress(False, Console(file=io.StringIO(), width=80))
    quiet.alert(f"room under {opt('max_disk')}")
    assert quiet.console.file.getvalue() == "room under max_disk\n"


def test_bytes_that_are_not_whole_characters_are_shown_as_bytes() -> None:
    """A response cut inside a character (byte-level BPE: one token per byte of a rare
    character) is written `<0xE6><0x97>`, the bytes UTF-8 gives (not U+FFFD); whole
    characters are written as the tokenizer writes them."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    from hookdump.tools.pictures.tokens import as_text

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["the cat sat", "a dog ran"] * 20, vocab_size=300)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    text = "the 日本 cat"
    ids = tokenizer.encode(text)
    assert as_text(tokenizer, ids) == text
    first = "日".encode()  # the character's own bytes
    at = len(tokenizer.encode("the ")) + 1  # its first byte's token, after ' '
    assert tokenizer.decode(ids[:at]).endswith("\ufffd")  # what the tokenizer writes
    assert as_text(tokenizer, ids[:at]) == f"the <0x{first[0]:02X}>"
    assert as_text(tokenizer, ids[: at + 1]) == f"the <0x{first[0]:02X}><0x{first[1]:02X}>"


def test_inspect_shows_no_mean_of_token_ids(gpt2: Path, corpus: Path, tmp_path: Path) -> None:
    """Token ids, sequence numbers and positions have no mean worth reading (`Dump.stats`
    has none for them): the table shows `-` for their mean and std, their min and max
    (the ids' range) as they are; the model's keys keep theirs."""
    import json

    from clitools import invoke

    out = tmp_path / "d"
    text = ["--text", str(corpus), "--context-size", "5", "--per-token"]
    result = invoke("run", f"hf:{gpt2}", *text, "-l", "h.1", "-o", str(out), "-q")
    assert result.exit_code == 0, result.stderr
    table = invoke("inspect", str(out)).stdout
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.strip()}
    ids = hookdump.load(out)["__token_ids__"]
    for key in ("__token_ids__", "__sample__", "__position__"):
        assert key in rows, table
        assert rows[key][6:8] == ["-", "-"], rows[key]  # mean, std (after "280 B")
    assert rows["__token_ids__"][8:10] == [f"{int(ids.min()):.4g}", f"{int(ids.max()):.4g}"]
    assert rows["h.1"][6] != "-" and rows["h.1"][7] != "-"
    assert json.loads(invoke("inspect", str(out), "--json").stdout)  # the JSON keeps them


def test_a_long_title_wraps_inside_the_picture(tmp_path: Path) -> None:
    """A picture's title (a long key, here) is wrapped onto lines that fit: no text reaches
    the picture's left or right edge (it was cut there: "shape [12")."""
    import torch
    from clitools import invoke
    from PIL import Image

    name = "a_rather_long_module_name_" * 6
    model = torch.nn.Sequential()
    model.add_module(name, torch.nn.Linear(4, 40))
    hookdump.dump(model, [torch.randn(3, 4)], tmp_path / "d", layers=[name], progress=False)
    result = invoke("show", str(tmp_path / "d"), name, "-s", "1", "-o", str(tmp_path / "x.png"))
    assert result.exit_code == 0, result.stderr
    picture = Image.open(tmp_path / "x.png").convert("L")
    width, height = picture.size
    edges = [*range(4), *range(width - 4, width)]
    band = [picture.getpixel((x, y)) for y in range(height // 8) for x in edges]
    assert min(band) > 200, "the title reaches an edge of the picture"


def test_a_generated_sequence_named_by_its_id_is_drawn_whole(tmp_path: Path) -> None:
    """`show -s prompts.txt:2` of a `--generate --per-token` dump: every token row of that
    sequence as one [tokens, features] heatmap (it drew the first token alone), rows named
    by their tokens, the response told apart (a line above it); a row number still draws
    that one row."""
    import transformers
    from clitools import invoke
    from tiny_text import tiny_causal_lm

    from hookdump.tools.pictures.sample import draw_sample

    model = tiny_causal_lm(tmp_path / "lm")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat\na dog ran in the\n")
    out, key = tmp_path / "gen", "transformer.h.1"
    run = ["--text", str(prompts), "--generate", "6", "--per-token", "-l", key, "-q"]
    result = invoke("run", f"hf:{model}", *run, "-o", str(out))
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    mine = dump["__sample__"] == 1
    picture = draw_sample(out, key, tmp_path / "seq.png", f"{prompts}:2")
    assert (picture.rows, picture.cols) == (int(mine.sum()), dump.info(key).shape[0])
    tokens = transformers.AutoTokenizer.from_pretrained(model).convert_ids_to_tokens(
        dump["__token_ids__"][mine].tolist()
    )
    assert [label.strip("·") for label in picture.labels] == [t.strip() for t in tokens]
    response = int(dump["__response__"][mine].sum())
    assert 0 < response < int(mine.sum())
    assert f"of the response (below the line), shape [{int(mine.sum())}," in picture.title
    one = draw_sample(out, key, tmp_path / "row.png", "3")  # a row number: one row, bars
    assert one.chart != "heatmap"


def test_a_sequence_whose_end_is_not_found_after_it_draws_its_first_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dump from elsewhere whose `__sample__` is not sorted can send the search for the
    next sequence before this one: the sequence is drawn from its first row, never as an
    empty stack (a traceback)."""
    import torch

    from hookdump.tools.pictures import sample

    tokens = {"input_ids": torch.arange(8).reshape(2, 4) % 5, "attention_mask": torch.ones(2, 4)}
    embed = torch.nn.Sequential(torch.nn.Embedding(5, 4))
    out = tmp_path / "t"
    hookdump.dump(embed, [tokens], out, layers="0", per_token=True, ids=["a", "b"],
                  forward=lambda m, b: m(b["input_ids"]))  # fmt: skip
    real = sample._first_token_row
    monkeypatch.setattr(sample, "_first_token_row",
                        lambda d, s, missing_ok=False: 0 if missing_ok else real(d, s))  # fmt: skip
    picture = sample.draw_sample(out, "0", tmp_path / "x.png", "b")
    assert picture.rows == 1 and "sequence b, 1 tokens" in picture.title
