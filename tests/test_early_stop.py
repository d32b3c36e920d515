"""Early stop: the forward ends once the selected modules have run, with identical results."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import tiny_models
from clitools import invoke

pytestmark = pytest.mark.usefixtures("in_tests_dir")
MODEL = "tiny_models:EarlyAndLate"


def calls_past_the_selection(*args: str) -> int:
    tiny_models.Tripwire.calls = 0
    result = invoke("run", MODEL, "-n", "6", "-b", "2", "-q", *args)
    assert result.exit_code == 0, result.stderr
    return tiny_models.Tripwire.calls


def test_the_forward_stops_after_the_last_selected_module() -> None:
    # three batches: one 1-sample calibration forward runs whole, the batches stop early
    assert calls_past_the_selection("-l", "early") == 1
    assert calls_past_the_selection("-l", "early", "--no-early-stop") == 3
    # act is called again after the tripwire: every call is waited for
    assert calls_past_the_selection("-l", "act") == 4
    # gradients need the whole forward
    assert calls_past_the_selection("-l", "early", "--capture", "grad") == 3


def test_a_selection_that_ends_the_forward_is_counted_in_the_first_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`middle` is followed by no parameters: no forward of one sample to count its calls;
    the first batch runs whole and counts them, the later ones stop after it."""
    import hookdump.engine.loop as loop

    calibrations = []
    real = loop.calibrate
    monkeypatch.setattr(loop, "calibrate", lambda *a: calibrations.append(1) or real(*a))
    assert calls_past_the_selection("-l", "middle") == 1  # the first batch's
    assert calibrations == []
    assert calls_past_the_selection("-l", "early") == 1  # the calibration's
    assert calibrations == [1]


@pytest.mark.parametrize(
    "selection",
    [
        ["-l", "layer1.0.conv1", "-l", "layer1.0.relu"],  # relu is called twice; calibrated
        ["-l", "layer4.1.relu", "-l", "avgpool"],  # only fc follows: counted in batch 1
    ],
)
def test_early_stop_gives_the_same_dump(tmp_path: Path, selection: list[str]) -> None:
    for name, extra in (("early", []), ("full", ["--no-early-stop"])):
        args = ["run", "resnet18", "--input-shape", "3,32,32", "-n", "6", "-b", "2", "-q"]
        assert invoke(*args, *selection, *extra, "-o", str(tmp_path / name)).exit_code == 0
    result = invoke("diff", str(tmp_path / "early"), str(tmp_path / "full"), "--atol", "0")
    assert result.exit_code == 0, result.stdout
    assert "all 3 keys match" in result.stdout


def test_the_first_shard_has_room_for_its_header_before_any_forward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every leaf of resnet18, counted in the first batch (no calibration forward to name
    the keys first): the header still fits the room kept for it, so the shard's data is
    never copied along to make room (that copy cost seconds per gigabyte)."""
    import hookdump.store.write.shards as shards

    def refuse(*args: object) -> int:
        raise AssertionError("the shard's data was moved to grow its header")

    monkeypatch.setattr(shards, "_move_data", refuse)
    args = ["run", "resnet18", "--input-shape", "3,32,32", "-n", "2", "-b", "2", "-q"]
    result = invoke(*args, "-o", str(tmp_path / "d"))
    assert result.exit_code == 0, result.stderr
    keys = json.loads((tmp_path / "d" / "manifest.json").read_text())["tensors"]
    calls = Counter(meta["module"] for meta in keys.values())
    assert len(keys) == 60 and calls["layer4.1.relu"] == 2  # more keys than modules
