"""The summary table at 80, 120 and 200 columns: narrower consoles drop the distribution,
module, dtype and an all-zero nan/inf column in that order, fold long keys, and never cut a
number; `diff`'s table folds its keys and verdicts, never a number. Golden files hold the
tables (UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console

from hookdump.cli.render import print_diff, print_inspection, summary_table
from hookdump.format.keys import KeyInfo
from hookdump.store.stats import KeySummary, TensorStats
from hookdump.tools.diff import DiffResult

GOLDEN = Path(__file__).parent / "golden"


def _key(key: str, module: str, shape: tuple[int, ...], stats: TensorStats) -> KeySummary:
    info = KeyInfo(key, key.split(":")[0], module, "output", 0, None, shape, torch.float32)
    return KeySummary(info, shape, "float32", 4 * 1000 * max(1, len(shape)), stats)


def _keys(nan: int = 0) -> list[KeySummary]:
    hist = [1, 3, 9, 27, 40, 27, 9, 3, 1, 0, 0, 1]
    return [
        _key("embeddings.word_embeddings", "Embedding", (128, 768),
             TensorStats(4096, -0.000123456, 0.4 * 4096, -98765.4321, 12345.678, 0, 0, hist)),
        _key("encoder.layer.11.attention.self.query:output.0", "Linear", (128, 12, 64),
             TensorStats(4096, 1.5e-12, 2.0 * 4096, -3.25, 1234567.0, nan, 0, hist)),
        _key("pooler", "BertPooler", (768,),
             TensorStats(768, 0.25, 0.01 * 768, -1.0, 1.0, 0, 0, hist)),
    ]  # fmt: skip


def _render(keys: list[KeySummary], width: int) -> str:
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    console.print(summary_table(keys, True, width), crop=False)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_table_at_each_width_matches_its_golden_file(width: int) -> None:
    text = _render(_keys(), width)
    golden = GOLDEN / f"summary_width_{width}.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
@pytest.mark.parametrize("nan", [0, 3])
def test_no_number_is_cut_and_columns_go_in_order(width: int, nan: int) -> None:
    keys = _keys(nan)
    text = _render(keys, width)
    assert "…" not in text
    for value in ("-9.877e+04", "1.235e+04", "1.235e+06", "-0.0001235", "1.5e-12"):
        assert value in text, (width, value)
    header = text.splitlines()[0].split()
    dropped = [c for c in ("distribution", "module", "dtype", "nan/inf") if c not in header]
    order = ["distribution", "module", "dtype", "nan/inf"][: len(dropped)]
    if nan:  # a nan/inf column that counts something stays
        order = [c for c in order if c != "nan/inf"]
        assert "nan/inf" in header and "3/0" in text
    assert dropped == order, (width, header)
    assert ("distribution" in header) is (width >= 200)
    key_cells = "".join(line[:16] for line in text.splitlines()[1:])
    assert "query:outp" in key_cells.replace(" ", "") or width > 80  # folded, not cut


def test_one_tensor_is_singular() -> None:
    assert "1 tensor " in _render(_keys()[:1], 200) and "3 tensors" in _render(_keys(), 200)


def test_inspection_prints_at_the_console_width(tmp_path: Path) -> None:
    from hookdump.tools.inspect import Inspection

    found = Inspection(tmp_path, True, 8, 1, _keys(), {"model": {"spec": "bert"}})
    out = io.StringIO()
    print_inspection(found, Console(file=out, width=80, color_system=None))
    assert max(len(line.rstrip()) for line in out.getvalue().splitlines()) <= 80
    assert "…" not in out.getvalue()


def _diff() -> DiffResult:
    from hookdump.tools.diff import KeyDiff

    keys = [
        KeyDiff("encoder.layer.11.attention.self.query:output.0", "encoder.layer.11", "differ",
                "", 0.08831, 664.8, 100269, 100352, 0.9, 1.0, 1.0),
        KeyDiff("layer4.0.relu", "layer4.0.relu", "differ", "", 0.08834,
                math.inf, 49760, 100352, 0.99996820, 1.0, 1.0, "float32 vs bfloat16"),
        KeyDiff("pooler", "pooler", "only in A"),
    ]  # fmt: skip
    return DiffResult(Path("a"), Path("b"), 1e-8, 1e-5, keys, (8, 8))


def _render_diff(width: int) -> str:
    out = io.StringIO()
    print_diff(_diff(), Console(file=out, width=width, color_system=None, legacy_windows=False))
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines()) + "\n"


def test_the_diff_table_at_80_columns_matches_its_golden_file() -> None:
    text = _render_diff(80)
    golden = GOLDEN / "diff_width_80.txt"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()


@pytest.mark.parametrize("width", [40, 60, 80, 120, 200])
def test_no_number_of_the_diff_table_is_cut(width: int) -> None:
    """At 80 columns, `diff` used to print `0.08…`, `664…` and `100269/10…`."""
    text = _render_diff(width)
    assert "…" not in text
    for value in ("0.08831", "664.8", "0.1", "100269/100352", "inf", "3.18e-05", "49760/100352"):
        assert value in text, (width, value)
    if width >= 80:  # room enough: the table fits
        assert max(len(line) for line in text.splitlines()) <= width
    lines = text.splitlines()
    status = lines[0].index("status")
    keys = "".join(line[:status] for line in lines[1:8]).replace(" ", "")
    assert "encoder.layer.11.attention.self.query:output.0" in keys  # folded, not cut


@pytest.mark.parametrize("width", [50, 80, 120])
def test_the_layer_listing_folds_names_and_never_cuts_a_number(width: int) -> None:
    """At 80 columns, `layers` of a ViT used to print `encoder.layers.encoder_layer_0.…`
    beside `2,…`."""
    from hookdump.cli.render import layers_table
    from hookdump.tools.layers import LayerRow

    name = "encoder.layers.encoder_layer_0.self_attention.out_proj"
    rows = [
        LayerRow(name, "NonDynamicallyQuantizableLinear", 590592, 0, {"": [197, 768]},
                 ops=["linear", "transpose@1"]),
        LayerRow("encoder.ln", "LayerNorm", 1536, 12, {"": [197, 768]}, ops=[]),
    ]  # fmt: skip
    out = io.StringIO()
    console = Console(file=out, width=width, color_system=None, legacy_windows=False)
    console.print(layers_table(rows, width), crop=False)
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert "…" not in out.getvalue()
    if width >= 80:  # narrower, the table is printed wider than the console, numbers whole
        assert max(len(line) for line in lines) <= width
    for value in ("590,592", "1,536", "12"):
        assert any(value in line.split() for line in lines), (width, value)
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("encoder."))
    column = lines[start - 1].index("class")
    folded = "".join(line[:column] for line in lines[start : start + 10]).replace(" ", "")
    assert name in folded


def test_a_long_name_folds_after_a_dot_where_it_can() -> None:
    """`blocks.11.hook_resid_post` in a narrow key column: the block, then the hook's name
    whole; a word wider than the column folds where it must."""
    stats = TensorStats(4096, 0.5, 0.25 * 4096, -1.0, 1.0, 0, 0, [1, 2, 1])
    keys = [_key("blocks.11.hook_resid_post", "GPT2Block", (128, 768), stats),
            _key("x" * 30, "Linear", (128, 768), stats)]  # fmt: skip
    lines = _render(keys, 60).splitlines()
    shape = lines[0].index("shape")
    cells = [line[:shape].strip() for line in lines[1:]]
    assert cells[:2] == ["blocks.11.", "hook_resid_post"]
    assert len(cells[2]) < 30 and "".join(cells[2:4]) == "x" * 30


def test_standard_names_stay_whole_at_80_columns() -> None:
    """The README's language-model example at 80 columns (issue 57): with the key column
    two characters short, the table gives up its outer margins rather than fold
    `blocks.0.hook_resid_post` after `blocks.0.`."""
    keys = [
        _key(f"blocks.{n}.hook_resid_post", "GPT2Block", (128,),
             TensorStats(14, -0.0001412, 0.03313**2 * 14, -0.1002, 0.1377, 0, 0, [1]))
        for n in range(6)
    ]  # fmt: skip
    lines = _render(keys, 80).splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if "blocks." in line]
    assert [row.split()[0] for row in rows] == [f"blocks.{n}.hook_resid_post" for n in range(6)]
    assert lines[0].startswith("key")  # the margin given up
    wide = _render(keys, 120).splitlines()
    assert wide[0].startswith(" key")  # kept where the table fits with it


def test_a_long_name_among_words_folds_after_a_dot() -> None:
    """`layers`' class column of a standard name, `output of model.layers.3.self_attn`, in a
    narrow column: rich wraps at the spaces, and the module's name breaks after a dot."""
    from hookdump.cli.render import layers_table
    from hookdump.hooks.names import Site
    from hookdump.tools.layers import LayerRow

    site = Site("blocks.3.hook_attn_out", "model.layers.3.self_attn", "output")
    rows = [LayerRow(site.name, "LlamaAttention", 3072, 1, {"": [128, 32]}, site=site)]
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(layers_table(rows, 60), crop=False)
    lines = out.getvalue().splitlines()
    header = next(i for i, line in enumerate(lines) if "class" in line)
    column = lines[header].index("class")
    cells = [line[column:].split("  ")[0].strip() for line in lines[header + 1 :]]
    assert cells == ["output of", "model.", "layers.3.", "self_attn"]  # not `model.layer`


def test_layers_at_80_columns_keeps_words_and_the_tree_whole() -> None:
    """A MoE model's `layers --tree` at 80 columns (issue 57): a class name breaks only
    where a CamelCase word starts (`MixtralTopK` / `Router`, not `MixtralTopKR` / `outer`),
    a folded name keeps its indentation, and outputs that all lack a batch dim say so once."""
    from hookdump.cli.render import layers_table
    from hookdump.tools.layers import LayerRow

    gate = "model.layers.0.mlp.gate"
    rows = [
        LayerRow("model.layers.0", "MixtralDecoderLayer", 21696, 1, {"": [128, 32]}),
        LayerRow("model.layers.0.self_attn.q_proj", "Linear", 1024, 1, {"": [128, 32]}),
        LayerRow(gate, "MixtralTopKRouter", 128, 1, {"0": [256, 4], "1": [256, 2], "2": [256, 2]},
                 unbatched=["0", "1", "2"]),
    ]  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(layers_table(rows, 80, indent=True))
    lines = out.getvalue().splitlines()
    header = next(i for i, line in enumerate(lines) if "class" in line)
    name_end, klass, params = (lines[header].index(w) for w in ("class", "class", "params"))
    classes = [line[klass:params].strip() for line in lines[header + 1 :]]
    shown = [c for c in classes if c]
    assert shown == ["Mixtral", "DecoderLayer", "Linear", "MixtralTopK", "Router"], shown
    names = [line[:name_end].rstrip() for line in lines[header + 1 :]]
    q = next(i for i, n in enumerate(names) if "self_attn" in n)
    indent = names[q].index("model.")  # the tree's indentation, on the folded line too
    assert names[q + 1][:indent].strip() == "" and names[q + 1][indent:] == "q_proj", names
    assert " ".join(out.getvalue().split()).count("(no batch dim)") == 1  # folded lines joined
