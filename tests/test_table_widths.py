"""The summary table at 80, 120 and 200 columns: narrower consoles drop the distribution,
module, dtype and an all-zero nan/inf column in that order, fold long keys, and never cut a
number. Golden files hold each width's table (UPDATE_GOLDEN=1 rewrites them)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
import torch
from rich.console import Console

from hookdump.cli.render import print_inspection, summary_table
from hookdump.format import KeyInfo
from hookdump.store.stats import KeySummary, TensorStats

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
    key_cells = "".join(line[1:16] for line in text.splitlines()[1:])
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
