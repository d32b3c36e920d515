from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # `import tiny_models` in library tests

torch.set_num_threads(2)

# what the tests that skip without the `s3-test` extra cannot import
_S3_TEST = ("moto", "s3fs", "ray", "flask", "boto")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--heavy",
        action="store_true",
        default=False,
        help="also run the heavy cases (marked slow: several processes, Ray, torchrun, "
        "full-size models, huge inputs), as .ci/run does",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default run is the fast set: the cases marked slow run with --heavy (or when
    picked with -m slow)."""
    if config.getoption("--heavy") or "slow" in (config.getoption("-m") or ""):
        return
    heavy = [item for item in items if item.get_closest_marker("slow") is not None]
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say why tests skipped where the count is printed: most need the `s3-test` extra."""
    deselected = terminalreporter.stats.get("deselected", [])
    if deselected and not terminalreporter.config.getoption("--heavy"):
        terminalreporter.write_line(
            f"{len(deselected)} heavy cases left out of this run (several processes, Ray, "
            "torchrun, huge inputs): python -m pytest --heavy runs them too, as CI does"
        )
    skipped = terminalreporter.stats.get("skipped", [])
    extra = [r for r in skipped if any(f"'{m}" in str(r.longrepr) for m in _S3_TEST)]
    if extra:
        terminalreporter.write_line(
            f"{len(extra)} of the {len(skipped)} skipped tests need an S3 server or Ray: "
            "pip install -e '.[s3-test]' (after '.[test]', in its own pip command) to run them"
        )


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


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """An S3 server on the loopback (moto's, spoken to by the real client), with the
    client's standard environment pointing at it: its endpoint URL."""
    import logging

    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    # port 0: the server binds a free port itself (one found free, then bound later, may be
    # taken meanwhile)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE"):
            patch.delenv(name, raising=False)
        patch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")  # never the user's
        try:
            yield endpoint
        finally:
            server.stop()


def new_bucket(name: str) -> str:
    """A new, empty bucket of the loopback S3 server (`s3_server` is up): its URL."""
    import re

    import fsspec

    bucket = re.sub(r"[^a-z0-9]+", "-", name.lower())[:40].strip("-") + "-b"
    fsspec.filesystem("s3", skip_instance_cache=True).mkdir(bucket)
    return f"s3://{bucket}"


@pytest.fixture(scope="module", params=["folder", "url"])
def place(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path | str]:
    """Where a module's dumps go, by name: a local folder, and (each test once more) a
    prefix in a bucket of the loopback S3 server, so every reader test runs on both."""
    if request.param == "folder":
        root = tmp_path_factory.mktemp("place")
        return lambda name: root / name
    request.getfixturevalue("s3_server")
    url = new_bucket(request.module.__name__.rsplit(".", 1)[-1])
    return lambda name: f"{url}/{name}"


@pytest.fixture
def bucket(s3_server: str, request: pytest.FixtureRequest) -> str:
    """A new, empty bucket of the loopback S3 server, for one test: its URL."""
    return new_bucket(request.node.name)
