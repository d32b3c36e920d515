"""Round 3 of hostile testing (issue 32): a test per mechanism, each against an
independent reference (the batches given, torch.isclose, a hand-made dump)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from safetensors.torch import load_file, save_file
from torch import nn

import hookdump
from hookdump.errors import HookdumpError

# --- N1: a key's dtype never changes under its rows ---------------------------------------


class _PassThrough(nn.Module):
    """Parameter-free modules: whatever dtype comes in goes out."""

    def __init__(self) -> None:
        super().__init__()
        self.r = nn.ReLU()
        self.f = nn.Flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self.r(x))


@pytest.mark.parametrize("shard_size", [None, 1])  # batches gathered in a shard, or one each
def test_a_lossless_dtype_change_is_cast_to_the_first_dtype(
    tmp_path: Path, shard_size: int | None
) -> None:
    torch.manual_seed(0)
    b1, b3 = torch.rand(4, 16), torch.rand(4, 16)
    b2 = torch.rand(4, 16).half()  # every float16 value is a float32 value
    options = {"shard_size": shard_size} if shard_size else {}
    d = hookdump.dump(_PassThrough(), [b1, b2, b3], tmp_path / "o", **options)
    assert d.info("r").dtype == torch.float32
    assert torch.equal(d["r"], torch.cat([b1, b2.float(), b3]))
    for shard in d.manifest.shards:  # every shard's header says float32 too
        assert all(t.dtype == torch.float32 for t in load_file(d.path / shard.file).values())


def test_int32_token_ids_beside_int64_ones_are_kept_exactly(tmp_path: Path) -> None:
    embed = nn.Sequential(nn.Embedding(1000, 8))
    torch.manual_seed(0)
    a = torch.randint(0, 1000, (4, 6))
    b = torch.randint(0, 1000, (4, 6)).int()
    d = hookdump.dump(embed, [a, b], tmp_path / "o", capture=("input",))
    assert torch.equal(d["0:input.0"], torch.cat([a, b.long()]))


@pytest.mark.parametrize("where", [1, 2])  # a batch in the middle, or the last one
def test_a_lossy_dtype_change_is_refused_naming_key_dtypes_and_sample(
    tmp_path: Path, where: int
) -> None:
    torch.manual_seed(0)
    batches = [torch.rand(4, 16) for _ in range(3)]
    batches[where] = torch.rand(4, 16, dtype=torch.float64)
    with pytest.raises(HookdumpError) as caught:
        hookdump.dump(_PassThrough(), batches, tmp_path / "o")
    message = str(caught.value)
    assert "'r' changed its dtype from float32 to float64" in message
    assert f"at sample {4 * where}" in message and "save_dtype" in message
    # what was committed before is readable and right
    if (tmp_path / "o" / "manifest.json").exists():
        d = hookdump.load(tmp_path / "o")
        assert not d.complete
        assert torch.equal(d["r"], torch.cat(batches[: d.num_samples // 4]))


# --- N2: diff: an Inf equals only the same Inf ----------------------------------------------


def _lone(path: Path, values: list[float]) -> Path:
    save_file({"k": torch.tensor([values])}, str(path))
    return path


INF = float("inf")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([1.0, 2.0, 3.0, 4.0], [INF, -INF, 3.0, 4.0]),
        ([INF, -INF, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]),
        ([INF, INF], [-INF, -INF]),
        ([1.0, float("nan")], [1.0, INF]),
    ],
)
def test_diff_counts_every_non_finite_mismatch_as_isclose_does(
    tmp_path: Path, a: list[float], b: list[float]
) -> None:
    expected = int((~torch.isclose(torch.tensor(a), torch.tensor(b), equal_nan=True)).sum())
    assert expected > 0
    result = invoke(
        "diff", str(_lone(tmp_path / "a.safetensors", a)),
        str(_lone(tmp_path / "b.safetensors", b)), "--json",
    )  # fmt: skip
    assert result.exit_code == 1, result.stdout + result.stderr
    (key,) = json.loads(result.stdout)["keys"]
    assert key["status"] == "differ" and key["mismatched"] == expected
    assert " vs " in key["detail"]  # the row names the first non-finite pair


def test_diff_row_says_which_non_finite_values_differ(tmp_path: Path) -> None:
    result = invoke(
        "diff", str(_lone(tmp_path / "a.safetensors", [1.0, 2.0])),
        str(_lone(tmp_path / "b.safetensors", [INF, 2.0])),
    )  # fmt: skip
    assert result.exit_code == 1
    assert "differ 1 vs inf" in result.stdout


def test_diff_same_infinities_and_nans_match(tmp_path: Path) -> None:
    values = [INF, -INF, float("nan"), 1.0]
    result = invoke(
        "diff", str(_lone(tmp_path / "a.safetensors", values)),
        str(_lone(tmp_path / "b.safetensors", values)),
    )  # fmt: skip
    assert result.exit_code == 0, result.stdout


# --- N3: what a run writes, its readers read ------------------------------------------------


def test_row_number_ids_are_left_out_of_the_manifest_and_read_back(tmp_path: Path) -> None:
    d = hookdump.dump(nn.Linear(4, 2), [torch.randn(3, 4), torch.randn(2, 4)], tmp_path / "o",
                      shard_size=1)  # fmt: skip
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert "sample_ids" not in manifest  # readers old and new take row numbers then
    assert hookdump.load(tmp_path / "o").sample_ids == list(range(5)) == d.sample_ids


def test_a_tensor_file_of_many_rows_writes_a_small_manifest(tmp_path: Path) -> None:
    rows = 200_000
    save_file({"x": torch.zeros(rows, 1)}, str(tmp_path / "rows.safetensors"))
    result = invoke(
        "run", "torch.nn:Flatten", "--input", str(tmp_path / "rows.safetensors"),
        "--batch-size", "50000", "--out", str(tmp_path / "o"), "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "o" / "manifest.json").stat().st_size < 20_000
    d = hookdump.load(tmp_path / "o")
    assert d.num_samples == rows and d.sample_ids[-1] == rows - 1


def test_given_ids_are_listed_and_mixed_ids_kept_in_order(tmp_path: Path) -> None:
    ids = [0, 1, "two", 3]  # row numbers, then not: listed whole
    d = hookdump.dump(nn.Linear(4, 2), [torch.randn(4, 4)], tmp_path / "o", ids=ids)
    assert d.sample_ids == ids


def test_ids_a_manifest_cannot_hold_are_refused_before_the_run_writes_them(
    tmp_path: Path,
) -> None:
    huge = ["x" * (100 << 20) + str(i) for i in range(2)]
    with pytest.raises(HookdumpError, match="ids are at most 4,096 characters"):
        hookdump.dump(nn.Linear(4, 2), [torch.randn(2, 4)], tmp_path / "o", ids=huge)


def test_non_finite_float_ids_are_written_as_valid_json(tmp_path: Path) -> None:
    hookdump.dump(nn.Linear(4, 2), [torch.randn(2, 4)], tmp_path / "o",
                  ids=["a", float("nan")])  # fmt: skip
    text = (tmp_path / "o" / "manifest.json").read_text()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(c))["sample_ids"] == ["a", "nan"]


def test_listed_ids_past_the_manifest_limit_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookdump.format import rows as fmt

    monkeypatch.setattr(fmt, "MAX_LISTED_IDS", 5)
    batches = [torch.randn(4, 4), torch.randn(4, 4)]
    with pytest.raises(HookdumpError, match="more than a manifest holds"):
        hookdump.dump(nn.Linear(4, 2), batches, tmp_path / "o", ids=[f"s{i}" for i in range(8)],
                      shard_size=1)  # fmt: skip
    d = hookdump.load(tmp_path / "o")  # the first shard stays listed, with its ids
    assert not d.complete and d.sample_ids == ["s0", "s1", "s2", "s3"]


# --- N9: Ctrl-C is not an Exception ---------------------------------------------------------


def test_ctrl_c_in_python_is_not_swallowed_by_except_exception(tmp_path: Path) -> None:
    def batches() -> Iterator[torch.Tensor]:
        for i in range(4):
            if i == 2:
                raise KeyboardInterrupt  # as the signal handler raises it in the main thread
            yield torch.randn(2, 4)

    done = []
    with pytest.raises(KeyboardInterrupt) as caught:
        for k in range(2):  # the loop of the report: skip what fails, go on
            try:
                hookdump.dump(nn.Linear(4, 2), batches(), tmp_path / f"o{k}", shard_size=1)
                done.append(k)
            except Exception:
                done.append(-1)
    assert done == []  # neither swallowed nor run on
    assert isinstance(caught.value, hookdump.Interrupted)
    assert "resume=True" in str(caught.value)
    d = hookdump.load(tmp_path / "o0")  # the finished shards were committed first
    assert not d.complete and d.num_samples == 4


# --- N7: finished work and user files are never deleted -------------------------------------


class _LongNames(nn.Module):
    """30 modules named with 600 characters each: a header of about 30 KB."""

    def __init__(self) -> None:
        super().__init__()
        self.names = [f"m{i:02d}_" + "L" * 600 for i in range(30)]
        for name in self.names:
            self.add_module(name, nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            x = getattr(self, name)(x)
        return x


def test_long_key_names_fit_the_header_room_without_copying_the_shard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hookdump.store.write import shards

    def copied(*_: object) -> int:
        raise AssertionError("the shard was copied to grow its header")

    monkeypatch.setattr(shards, "_move_data", copied)
    torch.manual_seed(0)
    model = _LongNames()
    batches = [torch.randn(2, 4) for _ in range(3)]  # a streamed shard, then a planned one
    d = hookdump.dump(model, batches, tmp_path / "o")
    assert len(d.manifest.shards) == 2 and d.complete
    x = torch.cat(batches)
    with torch.no_grad():
        for name in model.names:
            x = getattr(model, name)(x)
            assert torch.allclose(d[name], x)


def _npy_export(tmp_path: Path) -> tuple[Path, Path]:
    d = hookdump.dump(nn.Linear(4, 3), [torch.randn(5, 4)], tmp_path / "d")
    hookdump.export(d, tmp_path / "ex", to="npy")
    return tmp_path / "d", tmp_path / "ex"


def test_export_overwrite_refuses_a_folder_holding_the_users_files(tmp_path: Path) -> None:
    dump, ex = _npy_export(tmp_path)
    (ex / "notes.txt").write_text("mine")
    result = invoke("export", str(dump), str(ex), "--to", "npy", "--overwrite")
    assert_usage_error(result, "notes.txt", "which no export wrote")
    assert (ex / "notes.txt").read_text() == "mine"
    (ex / "notes.txt").unlink()  # an export's own files alone: replaced
    assert invoke("export", str(dump), str(ex), "--to", "npy", "--overwrite").exit_code == 0


def test_export_overwrite_of_an_export_without_a_file_list_knows_its_files(
    tmp_path: Path,
) -> None:
    dump, ex = _npy_export(tmp_path)
    marker = ex / "hookdump-export.json"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items()
                                  if k != "files"}))  # fmt: skip
    assert invoke("export", str(dump), str(ex), "--to", "npy", "--overwrite").exit_code == 0
    (ex / "notes.txt").write_text("mine")
    marker.write_text("{}")
    result = invoke("export", str(dump), str(ex), "--to", "npy", "--overwrite")
    assert_usage_error(result, "notes.txt")


# --- N4: reserved names never replace data --------------------------------------------------


class _Named(nn.Module):
    def __init__(self, *names: str) -> None:
        super().__init__()
        self.order = names
        for name in names:
            self.add_module(name, nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in self.order:
            x = getattr(self, name)(x)
        return x


def test_a_key_named_like_the_hf_id_column_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    d = hookdump.dump(_Named("__sample_id__", "b"), [torch.randn(3, 4)], tmp_path / "d")
    with pytest.raises(HookdumpError, match="'__sample_id__' is the name of the column"):
        hookdump.export(d, tmp_path / "ex", to="hf")
    hookdump.export(d, tmp_path / "ex", to="hf", keys="b")  # the other key alone: fine
    assert not (tmp_path / "ex" / "notes.txt").exists()


def _token_dump(path: Path) -> hookdump.Dump:
    embed = nn.Sequential()
    embed.add_module("e", nn.Embedding(50, 4))
    ids = torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(0))
    batch = {"input": ids, "input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def forward(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return m(b["input_ids"])

    return hookdump.dump(embed, [batch], path, per_token=True, forward=forward)


def test_a_saelens_hook_name_like_the_token_column_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("datasets")
    d = _token_dump(tmp_path / "d")
    with pytest.raises(HookdumpError, match="'token_ids' is the name of the column"):
        hookdump.export(d, tmp_path / "ex", to="saelens", keys="e", hook_name="token_ids")
    assert not (tmp_path / "ex").exists()


def test_with_index_refuses_a_key_named_row(tmp_path: Path) -> None:
    d = hookdump.dump(_Named("__row__"), [torch.randn(8, 4)], tmp_path / "d")
    with pytest.raises(HookdumpError, match="'__row__', which is a key"):
        next(iter(d.batches(["__row__"], 8, with_index=True)))
    (batch,) = list(d.batches(["__row__"], 8))
    assert torch.equal(batch["__row__"], d["__row__"])


# --- N5 and N12: readers' epochs, ranks and seeds --------------------------------------------


def _rows_dump(path: Path) -> hookdump.Dump:
    torch.manual_seed(0)
    return hookdump.dump(nn.Linear(8, 8), [torch.randn(200, 8) for _ in range(10)], path,
                         shard_size="16KiB")  # fmt: skip


def test_set_epoch_reaches_persistent_dataloader_workers(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    d = _rows_dump(tmp_path / "d")
    key = d.keys()[0]

    def first_rows(loader: DataLoader) -> list[int]:
        return sorted(int(r) for batch in loader for r in batch["__row__"][:3])

    options = {"shuffle": True, "with_index": True, "buffer_bytes": 1 << 16}
    ds = d.dataset([key], 100, **options)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    got = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        got.append(first_rows(loader))
    # the reference: a fresh dataset and loader per epoch, which cannot hold a stale epoch
    want = []
    for epoch in range(3):
        fresh = d.dataset([key], 100, **options)
        fresh.set_epoch(epoch)
        want.append(first_rows(DataLoader(fresh, batch_size=None, num_workers=2)))
    assert got == want
    assert got[0] != got[1] != got[2]


@pytest.mark.parametrize(
    ("rank", "world", "message"),
    [(5, 3, "rank 5 must be an integer from 0 to 2"), (-1, 3, "rank -1 must be"),
     (0, 0, "world_size 0 must be an integer of at least 1"), (0, -2, "world_size -2")],
)  # fmt: skip
def test_dataset_ranks_are_checked(tmp_path: Path, rank: int, world: int, message: str) -> None:
    d = hookdump.dump(nn.Linear(4, 2), [torch.randn(4, 4)], tmp_path / "d")
    with pytest.raises(HookdumpError, match=message):
        d.dataset(["0" if "0" in d else d.keys()[0]], 2, rank=rank, world_size=world)


@pytest.mark.parametrize("seed", [2**70, "a", -1, 1.5, True])
def test_a_seed_torch_cannot_take_is_refused_naming_it(tmp_path: Path, seed: object) -> None:
    d = hookdump.dump(nn.Linear(4, 2), [torch.randn(4, 4)], tmp_path / "d")
    with pytest.raises(HookdumpError, match="seed"):
        next(iter(d.batches(d.keys(), 2, shuffle=True, seed=seed)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [({"num_samples": 1.5}, TypeError, "num_samples must be an integer, not float"),
     ({"num_samples": "3"}, TypeError, "num_samples must be an integer, not str"),
     ({"layers": 5}, TypeError, "layers must be a string or a list of strings, not int"),
     ({"train": "yes"}, TypeError, "train must be True or False, not str"),
     ({"num_samples": 0}, HookdumpError, "num_samples 0 must be at least 1")],
)  # fmt: skip
def test_python_arguments_of_the_wrong_type_are_named(
    tmp_path: Path, options: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        hookdump.dump(nn.Linear(4, 2), [torch.randn(2, 4)], tmp_path / "o", **options)
    assert isinstance(caught.value, HookdumpError)  # a TypeError that is hookdump's too
    assert not (tmp_path / "o").exists()


def test_a_model_on_the_meta_device_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(HookdumpError, match="meta device"):
        hookdump.dump(nn.Linear(4, 2).to("meta"), [torch.randn(2, 4)], tmp_path / "o")


# --- N11: a full disk or a name too long is one line, and leaves nothing --------------------


@pytest.mark.parametrize("to", ["npy", "hf"])
def test_an_export_that_runs_out_of_room_is_one_line_and_leaves_nothing(
    tmp_path: Path, to: str
) -> None:
    from clitools import finish, hookdump_process

    pytest.importorskip("datasets")
    torch.manual_seed(0)
    hookdump.dump(nn.Linear(64, 64), [torch.randn(2000, 64) for _ in range(3)], tmp_path / "d")
    # a file-size limit stands in for a full disk: writes past it fail with an OSError
    code, stdout, stderr = finish(hookdump_process(
        "export", str(tmp_path / "d"), str(tmp_path / "ex"), "--to", to,
        limit_bytes=256 << 10,
    ))  # fmt: skip
    assert code == 2, stderr
    assert stdout == "" and stderr.startswith("Error: writing the export to")
    assert len(stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # no temporary folder left


def test_keys_too_long_for_file_names_get_short_unique_ones(tmp_path: Path) -> None:
    model = _Named("L" * 300, "L" * 299 + "M")
    d = hookdump.dump(model, [torch.randn(3, 4)], tmp_path / "d")
    hookdump.export(d, tmp_path / "ex", to="npy")
    index = json.loads((tmp_path / "ex" / "index.json").read_text())
    files = [entry["file"] for entry in index.values()]
    assert len(set(files)) == 2 and all(len(f) < 255 for f in files)
    import numpy as np

    for key, entry in index.items():
        array = np.load(tmp_path / "ex" / entry["file"], mmap_mode="r")
        assert torch.equal(torch.from_numpy(np.array(array)), d[key])


@pytest.mark.parametrize("suffix", [".pdf", ".png", ".svg"])
def test_a_picture_that_cannot_be_written_is_one_line(tmp_path: Path, suffix: str) -> None:
    pytest.importorskip("matplotlib")
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    d = hookdump.dump(nn.Linear(4, 3), [torch.randn(2, 4)], tmp_path / "d")
    full = tmp_path / f"full{suffix}"
    full.symlink_to("/dev/full")  # every write fails: no space left on device
    for args in (["show", str(d.path), d.keys()[0]], ["show", str(d.path), "--depth"]):
        result = invoke(*args, "--out", str(full))
        assert_usage_error(result, f"--out {full}: cannot write the picture")
    result = invoke("diff", str(d.path), str(d.path), "--plot", str(full), "-q")
    assert_usage_error(result, f"--plot {full}: cannot write the picture")
    result = invoke("diff", str(d.path), str(d.path), "--plot", str(tmp_path / "x.gif"), "-q")
    assert_usage_error(result, "--plot", ".gif is not a picture format")


# --- N8: inspect's table of very many keys is bounded -----------------------------------------


def test_inspect_of_many_keys_lists_the_first_and_every_non_finite_one(tmp_path: Path) -> None:
    from hookdump.cli.render import TABLE_KEYS

    tensors = {f"k{i:05d}": torch.ones(1, 1) for i in range(TABLE_KEYS + 2000)}
    tensors[f"k{TABLE_KEYS + 1500:05d}"] = torch.full((1, 1), float("nan"))
    save_file(tensors, str(tmp_path / "many.safetensors"))
    result = invoke("inspect", str(tmp_path / "many.safetensors"))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    shown = [line.split()[0] for line in lines if line.strip().startswith("k0")]
    assert shown == [f"k{i:05d}" for i in range(TABLE_KEYS)] + [f"k{TABLE_KEYS + 1500:05d}"]
    assert f"{TABLE_KEYS + 2000} tensors" in result.stdout  # the footer counts them all
    assert "... 1,999 more keys not shown (--json lists every key)" in result.stdout
    listed = json.loads(invoke("inspect", str(tmp_path / "many.safetensors"), "--json").stdout)
    assert len(listed["tensors"]) == TABLE_KEYS + 2000


# --- N13: messages that name the real cause ---------------------------------------------------


def test_a_module_named_like_a_reserved_key_is_refused_naming_it(tmp_path: Path) -> None:
    model = _Named("__sample__")
    ids = torch.randint(0, 4, (2, 3), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def forward(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        return m(b["input_ids"].float()[..., None].expand(-1, -1, 4))

    with pytest.raises(HookdumpError, match="the module '__sample__' would be saved under"):
        hookdump.dump(model, [batch], tmp_path / "o", per_token=True, forward=forward)
    assert not (tmp_path / "o").exists()


def test_an_export_to_a_symlink_writes_where_the_link_points(tmp_path: Path) -> None:
    """Issue 32 (EX5): the link was renamed aside and a real folder made beside it."""
    d = hookdump.dump(nn.Linear(4, 3), [torch.randn(5, 4)], tmp_path / "d")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "lnk").symlink_to(elsewhere)
    result = invoke("export", str(d.path), str(tmp_path / "lnk"), "--to", "npy")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "lnk").is_symlink()
    assert (elsewhere / "index.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "elsewhere", "lnk"]
    overlap = invoke("export", str(d.path), str(d.path / "sub"), "--to", "npy")
    line = assert_usage_error(overlap, "the export folder", "overlap")
    assert "--out" not in line


def test_an_export_of_zero_width_rows_is_refused_before_any_walk(tmp_path: Path) -> None:
    """Issue 32 (N8): 10^12 rows of shape [0] built 7 GB of ids (hf) or never ended (npy)."""
    import struct

    folder = tmp_path / "z"
    folder.mkdir()
    rows = 10**12
    header = json.dumps({"k": {"dtype": "F32", "shape": [rows, 0], "data_offsets": [0, 0]},
                         "__metadata__": {"run_id": "r"}}).encode()  # fmt: skip
    header += b" " * (-len(header) % 8)
    (folder / "shard-00000.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (folder / "manifest.json").write_text(json.dumps({
        "format": "hookdump/1", "complete": True, "num_samples": rows, "run_id": "r",
        "tensors": {"k": {"module": "k", "kind": "output", "shape": [0], "dtype": "float32"}},
        "shards": [{"file": "shard-00000.safetensors", "start": 0, "stop": rows}],
    }))  # fmt: skip
    for to in ("npy", "hf"):
        result = invoke("export", str(folder), str(tmp_path / to), "--to", to)
        assert_usage_error(result, "'k' has no value in a row (shape [0])", "--keys")
