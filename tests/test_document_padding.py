"""Document mode's padding: under `--per-token` a batch is padded to its longest document
(`--max-length` the cap), `--sort-by-length` batches documents of about one length, `--bos`
puts BOS first; the rows per sample id are those of each document run alone."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from clitools import invoke
from tiny_text import CORPUS, ctrl_c_in_batch, tiny_bert

import hookdump
from hookdump.inputs.text import TextOptions, samples

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("in_tests_dir")

WORDS = " ".join(CORPUS).split()


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert"), max_position_embeddings=24)


@pytest.fixture
def varied(tmp_path: Path) -> Path:
    """Documents of 1 to 30 words in a shuffled order (the longest cut at --max-length)."""
    rng = random.Random(3)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 30))) for _ in range(11)]
    path = tmp_path / "varied.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def _alone(folder: Path, corpus: Path, max_length: int, bos: int | None = None) -> dict:
    """Each document run through the model on its own, unpadded: id -> (ids, hidden of
    layer 1), the reference every padding must give."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModel.from_pretrained(folder).eval()
    found = {}
    for line, text in enumerate(corpus.read_text().splitlines(), 1):
        ids = tokenizer(text, truncation=True, max_length=max_length)["input_ids"]
        if bos is not None:
            ids = [bos, *ids][:max_length]
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        found[f"{corpus}:{line}"] = (torch.tensor(ids), out.hidden_states[1][0])
    return found


def _by_sample(out: Path) -> dict:
    dump = hookdump.load(out)
    rows = {}
    for index, sample_id in enumerate(dump.sample_ids):
        at = dump["__sample__"] == index
        assert torch.equal(dump["__position__"][at], torch.arange(int(at.sum())))
        rows[sample_id] = (dump["__token_ids__"][at], dump["encoder.layer.0"][at])
    return rows


@pytest.mark.parametrize("sort", [False, True])
def test_dynamic_padding_gives_each_document_alone(
    bert: Path, varied: Path, tmp_path: Path, sort: bool
) -> None:
    out = tmp_path / "d"
    result = invoke("run", f"hf:{bert}", "--text", str(varied), "--max-length", "20",
                    "--per-token", "-l", "encoder.layer.0", "-b", "4", "-o", str(out),
                    *(["--sort-by-length"] if sort else []))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    reference = _alone(bert, varied, 20)
    rows = _by_sample(out)
    assert rows.keys() == reference.keys()
    for sample_id, (ids, hidden) in reference.items():
        assert torch.equal(rows[sample_id][0], ids), sample_id
        torch.testing.assert_close(rows[sample_id][1], hidden, atol=1e-5, rtol=1e-4)
    dump = hookdump.load(out)
    lengths = [len(reference[s][0]) for s in dump.sample_ids]
    assert lengths == (sorted(lengths, reverse=True) if sort else
                       [len(v[0]) for v in reference.values()])  # fmt: skip
    assert dump.manifest["input"]["padding"] == "longest"
    assert dump.manifest["input"]["sort_by_length"] is sort
    # the footer's fraction: real tokens over the positions of batches padded to their longest
    widths = [max(lengths[i : i + 4]) * len(lengths[i : i + 4]) for i in range(0, 11, 4)]
    assert f"({sum(lengths) / sum(widths):.0%} of the positions computed" in result.stdout


def test_sorting_pads_less(bert: Path, varied: Path, tmp_path: Path) -> None:
    fractions = []
    for sort in ([], ["--sort-by-length"]):
        out = tmp_path / f"d{len(sort)}"
        assert invoke("run", f"hf:{bert}", "--text", str(varied), "--max-length", "20",
                      "--per-token", "-l", "encoder.layer.0", "-b", "4", "-o", str(out),
                      *sort).exit_code == 0  # fmt: skip
        dump = hookdump.load(out)
        lengths = torch.bincount(dump["__sample__"]).tolist()
        widths = [max(lengths[i : i + 4]) * len(lengths[i : i + 4]) for i in range(0, 11, 4)]
        fractions.append(sum(lengths) / sum(widths))
    assert fractions[1] > fractions[0]


def test_static_padding_without_token_rows(bert: Path, varied: Path, tmp_path: Path) -> None:
    """Sample rows keep one shape: every batch is padded to --max-length, as before."""
    out = tmp_path / "d"
    result = invoke("run", f"hf:{bert}", "--text", str(varied), "--max-length", "20",
                    "-l", "encoder.layer.0", "-b", "4", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    dump = hookdump.load(out)
    assert dump["__input_ids__"].shape == (11, 20)
    real = int(dump["__attention_mask__"].sum())
    assert dump.manifest["input"]["padding"] == "max_length"
    assert f"({real / 220:.0%} of the positions computed were real tokens)" in result.stdout


def test_bos_in_document_mode(gpt2: Path, varied: Path, tmp_path: Path) -> None:
    """The tiny tokenizer has no BOS: EOS goes first, as packed windows do; the rows equal
    the model run on [EOS] + the document."""
    out = tmp_path / "d"
    result = invoke("run", f"hf:{gpt2}", "--text", str(varied), "--max-length", "12", "--bos",
                    "--per-token", "-l", "h.0", "-b", "3", "-o", str(out))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    eos = transformers.AutoTokenizer.from_pretrained(gpt2).eos_token_id
    reference = _alone(gpt2, varied, 12, bos=eos)
    dump = hookdump.load(out)
    for index, sample_id in enumerate(dump.sample_ids):
        at = dump["__sample__"] == index
        assert torch.equal(dump["__token_ids__"][at], reference[sample_id][0])
        torch.testing.assert_close(dump["h.0"][at], reference[sample_id][1])
    assert dump.manifest["input"]["bos"] is True


def test_bos_is_not_doubled_where_the_template_has_it(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>"]))
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="<s>", unk_token="[UNK]"
    )
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat\n")
    made = list(samples(TextOptions(str(corpus), bos=True, max_length=8), tokenizer, None))
    assert made[0][1] == tokenizer("the cat sat")["input_ids"]
    assert made[0][1][:2] == [1, tokenizer.convert_tokens_to_ids("the")]


def test_resume_keeps_the_sorted_order(
    bert: Path, varied: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("run", f"hf:{bert}", "--text", str(varied), "--max-length", "20", "--per-token",
            "-l", "encoder.layer.0", "-b", "2", "--sort-by-length",
            "--shard-size", "1")  # fmt: skip
    whole = tmp_path / "whole"
    assert invoke(*args, "-o", str(whole)).exit_code == 0
    out = tmp_path / "d"
    ctrl_c_in_batch(monkeypatch, 3)
    assert invoke(*args, "-o", str(out)).exit_code == 130
    monkeypatch.undo()
    assert invoke(*args, "-o", str(out), "--resume").exit_code == 0
    assert invoke("diff", str(whole), str(out), "--atol", "0", "--rtol", "0").exit_code == 0
    assert hookdump.load(out).sample_ids == hookdump.load(whole).sample_ids
