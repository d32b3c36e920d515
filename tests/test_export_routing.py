"""`hookdump export --to routing` (issue 58): each token's chosen experts per sequence, int32
`[tokens, moe_layers, top_k]`, as the engines' routing replay takes them, from a tiny random
Mixtral's per-token dump; checked against the experts the model's own router logits
(`output_router_logits`) choose, and -1 where a slot is not to be replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from clitools import assert_usage_error, invoke
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import hookdump

transformers = pytest.importorskip("transformers")

TOP = 2
PROMPTS = [[5, 9, 2, 7, 30], [3, 4, 60]]
MOE = "model.layers.*.mlp"


@pytest.fixture(scope="module")
def mixtral() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_experts_per_tok=TOP,
        num_local_experts=4,
    )  # fmt: skip
    return transformers.MixtralForCausalLM(config).eval()


def _own_choice(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """[tokens, layers, top_k], each row sorted: the experts the model's own router logits
    choose (the top-k of their softmax)."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_router_logits=True)
    chosen = [logits.softmax(-1).topk(TOP).indices for logits in out.router_logits]
    return torch.stack(chosen, dim=1).sort(-1).values


def _dump(model: torch.nn.Module, out: Path, **more: object) -> hookdump.Dump:
    batches = [{"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids))}
               for ids in PROMPTS]  # fmt: skip
    more.setdefault("per_token", True)
    return hookdump.dump(model, batches, out, layers=MOE, capture="routing", **more)


def test_each_sequences_routing_is_the_models_own(mixtral: torch.nn.Module, tmp_path: Path) -> None:
    _dump(mixtral, tmp_path / "d", ids=lambda b: [f"seq-{int(b['input_ids'][0, 0])}"])
    out = tmp_path / "routing.safetensors"
    result = invoke("export", str(tmp_path / "d"), "--to", "routing", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"2 sequences of 2 keys -> {out} (routing)\n"
    written = load_file(out)
    assert written["routed_experts"].dtype == torch.int32
    assert written["offsets"].tolist() == [0, 5, 8]
    for index, ids in enumerate(PROMPTS):
        lo, hi = written["offsets"][index], written["offsets"][index + 1]
        mine = written["routed_experts"][lo:hi].sort(-1).values
        assert torch.equal(mine.long(), _own_choice(mixtral, ids))
    with safe_open(str(out), "pt") as file:
        meta = file.metadata()
    assert json.loads(meta["layers"]) == [
        "model.layers.0.mlp:topk_ids",
        "model.layers.1.mlp:topk_ids",
    ]
    assert json.loads(meta["sample_ids"]) == ["seq-5", "seq-3"]
    assert meta["completion_only"] == "false"


def test_a_position_without_a_row_is_not_replayed(mixtral: torch.nn.Module, tmp_path: Path) -> None:
    """Token rows from position 1 on: every sequence's first slot is -1."""
    _dump(mixtral, tmp_path / "d", positions="1:")
    out = tmp_path / "r.safetensors"
    hookdump.export(tmp_path / "d", out, to="routing")
    written = load_file(out)
    assert written["offsets"].tolist() == [0, 5, 8]
    routed = written["routed_experts"]
    assert (routed[[0, 5]] == -1).all() and (routed[1:5] >= 0).all() and (routed[6:] >= 0).all()
    assert torch.equal(routed[1:5].sort(-1).values.long(), _own_choice(mixtral, PROMPTS[0])[1:])


def test_completion_only_leaves_the_prompt_out(mixtral: torch.nn.Module, tmp_path: Path) -> None:
    _dump(mixtral, tmp_path / "g", generate=3)
    dump = hookdump.load(tmp_path / "g")
    out = tmp_path / "r.safetensors"
    hookdump.export(dump, out, to="routing", completion_only=True)
    routed = load_file(out)["routed_experts"]
    response = dump["__response__"].bool()
    assert routed.shape == (len(response), 2, TOP) and int(response.sum()) == 6
    assert (routed[~response] == -1).all()
    assert torch.equal(routed[response][:, 0].long(), dump["model.layers.0.mlp:topk_ids"][response])
    # every token, without it: the prompt and the completion alike
    hookdump.export(dump, out, to="routing", overwrite=True)
    assert (load_file(out)["routed_experts"] >= 0).all()


def test_what_cannot_be_exported_is_one_line(mixtral: torch.nn.Module, tmp_path: Path) -> None:
    _dump(mixtral, tmp_path / "d")
    out = tmp_path / "r.safetensors"
    args = ["export", str(tmp_path / "d"), "--to", "routing"]
    assert_usage_error(invoke(*args, "--out", str(out), "--completion-only"), "__response__")
    assert_usage_error(invoke(*args, "--out", str(out), "--keys", "*:router_logits"),
                       "holds no chosen experts of --keys")  # fmt: skip
    assert_usage_error(invoke(*args), "give OUT once")
    assert_usage_error(invoke(*args, str(out), "--out", str(out)), "give OUT once")
    assert_usage_error(invoke(*args, "--out", str(tmp_path)), "is a folder")
    assert invoke(*args, "--out", str(out)).exit_code == 0
    assert_usage_error(invoke(*args, "--out", str(out)), "exists; --overwrite replaces")
    mine = tmp_path / "mine.safetensors"
    save_file({"x": torch.zeros(1)}, mine)
    line = assert_usage_error(invoke(*args, "--out", str(mine), "--overwrite"))
    assert "is not an earlier routing export; it is left as it is" in line
    assert load_file(mine)["x"].tolist() == [0.0]
    assert_usage_error(
        invoke("export", str(tmp_path / "d"), str(tmp_path / "hf"), "--to", "hf",
               "--completion-only"),
        "--completion-only is for --to routing",
    )  # fmt: skip
    ids = torch.tensor([[5, 9, 2], [3, 4, 60]])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    hookdump.dump(mixtral, [batch], tmp_path / "per-sample", layers=MOE, capture="routing")
    line = assert_usage_error(
        invoke(
            "export",
            str(tmp_path / "per-sample"),
            "--to",
            "routing",
            "--out",
            str(tmp_path / "p.safetensors"),
        )
    )
    assert "does not hold token rows" in line


def test_diff_reports_how_many_tokens_choose_the_same_experts(
    mixtral: torch.nn.Module, tmp_path: Path
) -> None:
    """B's router of block 0 leans to expert 0: the share of tokens that still choose as A
    does, and the first that does not, against the two models' own router logits."""
    import copy

    leaning = copy.deepcopy(mixtral)
    with torch.no_grad():
        leaning.model.layers[0].mlp.gate.weight[0] += 0.6
    _dump(mixtral, tmp_path / "a")
    _dump(leaning, tmp_path / "b")
    mine = torch.cat([_own_choice(mixtral, ids) for ids in PROMPTS])[:, 0]
    theirs = torch.cat([_own_choice(leaning, ids) for ids in PROMPTS])[:, 0]
    same = (mine == theirs).all(-1)
    assert 0 < int(same.sum()) < len(same)  # some tokens moved, not all
    first = int((~same).nonzero()[0])
    sample, position = (0, first) if first < len(PROMPTS[0]) else (1, first - len(PROMPTS[0]))
    result = invoke("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--keys", "*:topk_ids")
    assert result.exit_code == 1
    share = int(same.sum()) / len(same)
    assert (
        f"routing of model.layers.0.mlp: {share:.1%} of 8 tokens choose the same experts; the "
        f"first that does not: row {first} (sample {sample}, position {position})"
    ) in result.stdout
    assert "routing of model.layers.1.mlp: " in result.stdout  # block 1's input moved too
    report = json.loads(invoke("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json").stdout)
    block0 = report["routing"][0]
    assert (block0["tokens"], block0["agree"], block0["first_differing_row"]) == (
        8, int(same.sum()), first,
    )  # fmt: skip


def test_a_router_that_returns_probabilities_as_logits_is_refused(
    mixtral: torch.nn.Module, tmp_path: Path
) -> None:
    """As some transformers releases' routers did: softmax in the logits' slot."""
    import copy

    probable = copy.deepcopy(mixtral)
    for layer in probable.model.layers:
        layer.mlp.gate.register_forward_hook(lambda m, a, out: (out[0].softmax(-1), *out[1:]))
    with pytest.raises(hookdump.HookdumpError) as raised:
        _dump(probable, tmp_path / "d")
    said = str(raised.value)
    assert "the router of model.layers.0.mlp (MixtralTopKRouter) returns probabilities" in said
    assert "they are not written as router_logits" in said
    assert (
        not (tmp_path / "d" / "manifest.json").exists()
        or not hookdump.load(tmp_path / "d").complete
    )
    _dump(mixtral, tmp_path / "fine")  # its own router's logits pass
