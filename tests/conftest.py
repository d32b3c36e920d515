from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # `import tiny_models` in library tests

torch.set_num_threads(2)


@pytest.fixture
def in_tests_dir(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from tests/, so `tiny_models:NAME` imports as a MODEL spec does for a user."""
    monkeypatch.chdir(TESTS)
    return TESTS


@pytest.fixture(scope="session")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 2-layer GPT-2 of `tiny_text`, with 64 positions (a test file may define its own)."""
    from tiny_text import tiny_gpt2

    return tiny_gpt2(tmp_path_factory.mktemp("gpt2"), n_positions=64)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """`tiny_text.CORPUS` as a .txt file, a document per line (one of them blank)."""
    from tiny_text import CORPUS

    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n")
    return path


def hook_state(model: torch.nn.Module) -> list[tuple[str, int]]:
    """Every hook dict of every module, with its size (to prove hooks were all removed)."""
    dicts = (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_backward_hooks",
        "_backward_pre_hooks",
    )
    return [
        (f"{name}.{attr}", len(getattr(module, attr)))
        for name, module in model.named_modules()
        for attr in dicts
    ]
