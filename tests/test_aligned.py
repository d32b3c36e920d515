"""`hookdump.aligned` (issue 36, part 2): rows of several dumps read together, row i of each
the same token, with one shuffle; checked against each dump's own rows at the row numbers
the pass gives (`__row__`), for a model and a perturbed copy on one corpus (shards cut
differently), and for an MLP's input and output in one dump; dumps that disagree refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from clitools import invoke

import hookdump

pytestmark = pytest.mark.usefixtures("in_tests_dir")


def _perturbed(gpt2: Path, folder: Path) -> Path:
    """The same GPT-2 with every weight nudged: a 'fine-tuned' copy."""
    import shutil

    import transformers

    shutil.copytree(gpt2, folder)
    model = transformers.GPT2Model.from_pretrained(gpt2)
    torch.manual_seed(5)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter += 0.01 * torch.randn_like(parameter)
    model.save_pretrained(folder)
    return folder


def _dump(model: Path, corpus: Path, out: Path, *extra: str) -> hookdump.Dump:
    result = invoke("run", f"hf:{model}", "--text", str(corpus), "--per-token",
                    "--context-size", "6", "-l", "h.1", "-l", "h.1.mlp.c_fc", "-c",
                    "input,output", "-b", "2", "-q", "-o", str(out), *extra)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return hookdump.load(out)


@pytest.fixture(scope="module")
def pair(gpt2: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[hookdump.Dump, ...]:
    from tiny_text import CORPUS

    folder = tmp_path_factory.mktemp("pair")
    corpus = folder / "c.txt"
    corpus.write_text("\n".join(CORPUS * 4) + "\n")
    other = _perturbed(gpt2, folder / "tuned")
    base = _dump(gpt2, corpus, folder / "base", "--shard-size", "5000")
    tuned = _dump(other, corpus, folder / "tuned-d", "--shard-size", "30000")
    assert [s.start for s in base.manifest.shards] != [s.start for s in tuned.manifest.shards]
    shuffled = folder / "other" / "c.txt"  # the same words in another order: as many rows
    shuffled.parent.mkdir()
    shuffled.write_text("\n".join(reversed(CORPUS * 4)) + "\n")
    return base, tuned, _dump(gpt2, shuffled, folder / "again")


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_model_and_its_tuned_copy_read_token_by_token(pair: tuple, shuffle: bool) -> None:
    base, tuned, _ = pair
    sources = {"base": (base, "h.1"), "tuned": (tuned.path, "h.1")}
    pairs = hookdump.aligned(sources)
    batches = list(
        pairs.batches(16, shuffle=shuffle, seed=3, with_index=True, buffer_bytes=1 << 16)
    )
    rows = torch.cat([b["__row__"] for b in batches])
    assert sorted(rows.tolist()) == list(range(base.num_samples))  # every row once
    assert (rows.tolist() == sorted(rows.tolist())) is not shuffle
    for batch in batches:
        assert set(batch) == {"base", "tuned", "__row__"}
        assert torch.equal(batch["base"], base["h.1"][batch["__row__"]])
        assert torch.equal(batch["tuned"], tuned["h.1"][batch["__row__"]])
    assert not torch.equal(torch.cat([b["base"] for b in batches]),
                           torch.cat([b["tuned"] for b in batches]))  # fmt: skip


def test_an_mlps_input_and_output_from_one_dump(pair: tuple) -> None:
    base = pair[0]
    import transformers

    base = pair[0]
    sources = {"in": (base, "h.1.mlp.c_fc:input.0"), "out": (base, "h.1.mlp.c_fc")}
    folder = base.manifest["model"]["spec"].removeprefix("hf:")
    fc = transformers.GPT2Model.from_pretrained(folder).h[1].mlp.c_fc  # x @ weight + bias
    seen = 0
    for batch in hookdump.aligned(sources).batches(32, shuffle=True, seed=0):
        with torch.no_grad():
            own = batch["in"] @ fc.weight + fc.bias  # the layer's own output, of its input
        torch.testing.assert_close(batch["out"], own, rtol=1e-5, atol=1e-5)
        seen += len(batch["in"])
    assert seen == base.num_samples


def test_dumps_of_other_rows_are_refused_in_one_line(pair: tuple) -> None:
    base, tuned, again = pair
    with pytest.raises(
        hookdump.HookdumpError, match="disagree at a token row: __token_ids__"
    ) as raised:
        list(hookdump.aligned({"a": (base, "h.1"), "b": (again, "h.1")}).batches(8))
    ours, theirs = base["__token_ids__"], hookdump.load(again.path)["__token_ids__"]
    row = int((ours[: len(theirs)] != theirs[: len(ours)]).nonzero()[0])
    sample = int(base["__sample__"][row])  # the sample of the first row that differs
    assert f"(a token of sample {sample})" in str(raised.value)
    small = hookdump.load(base.path)
    with pytest.raises(hookdump.HookdumpError, match="must map a name to"):
        hookdump.aligned([(small, "h.1")])  # type: ignore[arg-type]
    with pytest.raises(hookdump.HookdumpError, match=r"names 'h\.1' of .* twice"):
        hookdump.aligned({"a": (small, "h.1"), "b": (small.path, "h.1")})
    with pytest.raises(KeyError, match=r"'h\.9' is not in"):
        hookdump.aligned({"a": (base, "h.9"), "b": (tuned, "h.1")})


@pytest.mark.filterwarnings("ignore:This DataLoader will create 2 worker processes")
def test_dataloader_workers_and_ranks_read_every_aligned_row_once(pair: tuple) -> None:
    base, tuned, _ = pair
    pairs = hookdump.aligned({"base": (base, "h.1"), "tuned": (tuned, "h.1")})
    rows: list[int] = []
    for rank in range(2):
        data = pairs.dataset(8, shuffle=True, with_index=True, rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2)
        for batch in loader:
            assert torch.equal(batch["base"], base["h.1"][batch["__row__"]])
            assert torch.equal(batch["tuned"], tuned["h.1"][batch["__row__"]])
            rows += batch["__row__"].tolist()
    assert sorted(rows) == list(range(base.num_samples))
