"""The README's main command on a real resnet50 (slow: seconds, a 480 MB dump)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor

import hookdump

README = Path(__file__).parents[1] / "README.md"


@pytest.mark.slow
def test_readme_example_dumps_resnet50_layer1(tmp_path: Path) -> None:
    command = next(
        line.strip().removeprefix("$ ")
        for line in README.read_text().splitlines()
        if "hookdump run resnet50" in line
    )
    argv = shlex.split(command.split("&&")[-1].strip())
    assert argv[:3] == ["hookdump", "run", "resnet50"]
    proc = subprocess.run(
        [sys.executable, "-m", "hookdump", *argv[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"COLUMNS": "200", "PATH": ""},
    )
    assert proc.returncode == 0, proc.stderr
    assert "33 tensors" in proc.stdout
    out = tmp_path / "acts"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["num_samples"] == 8

    dump = hookdump.load(out)
    # each Bottleneck calls its one ReLU three times
    for block in range(3):
        assert {f"layer1.{block}.relu", f"layer1.{block}.relu@1", f"layer1.{block}.relu@2"} <= set(
            dump.keys()
        )
    # Reference: the same seeded model, fed the block's captured input, through the FX
    # extractor: every call of layer1.1.relu and a conv must match.
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    block_in = dump["layer1.0"]  # = layer1.1's input
    extractor = create_feature_extractor(
        model.layer1[1], return_nodes=["conv3", "relu", "relu_1", "relu_2"]
    )
    with torch.no_grad():
        reference = extractor(block_in)
    torch.testing.assert_close(dump["layer1.1.conv3"], reference["conv3"])
    torch.testing.assert_close(dump["layer1.1.relu"], reference["relu"])
    torch.testing.assert_close(dump["layer1.1.relu@1"], reference["relu_1"])
    torch.testing.assert_close(dump["layer1.1.relu@2"], reference["relu_2"])
    # the BatchNorm before the in-place ReLU, recomputed from the captured conv output
    torch.testing.assert_close(
        dump["layer1.1.bn1"], model.layer1[1].bn1(dump["layer1.1.conv1"]).detach()
    )
    assert (dump["layer1.1.bn1"] < 0).any()


def test_the_readmes_language_model_recipe_runs_offline(tmp_path: Path) -> None:
    """The README's offline recipe, run as written: a small GPT-2 folder with random weights
    and a tokenizer trained on the spot, then a dump of its residual stream by token,
    equal to transformers' own hidden states."""
    import transformers

    text = README.read_text()
    start = text.index("## A language model, offline")
    block = text[start:].split("```\n", 2)[1]
    bin_dir = str(Path(sys.executable).parent)  # its python and hookdump
    env = {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "HF_HUB_OFFLINE": "1",
           "COLUMNS": "120"}  # fmt: skip
    proc = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "blocks.5.hook_resid_post" in proc.stdout
    # transformers' warnings of ids past the vocabulary (issue 57): the recipe passes its own
    assert "token_id" not in proc.stderr, proc.stderr
    dump = hookdump.load(tmp_path / "lm")
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "my-gpt2").eval()
    ids, sample = dump["__token_ids__"], dump["__sample__"]
    first = ids[sample == 0]
    with torch.no_grad():
        hidden = model(first[None], output_hidden_states=True).hidden_states
    for block in range(5):  # hidden_states[n + 1] is block n's output
        torch.testing.assert_close(dump[f"blocks.{block}.hook_resid_post"][sample == 0],
                                   hidden[block + 1][0])  # fmt: skip
    with torch.no_grad():  # the last hidden state has the final LayerNorm applied
        last = model.transformer.ln_f(dump["blocks.5.hook_resid_post"][sample == 0])
    torch.testing.assert_close(last, hidden[6][0])
