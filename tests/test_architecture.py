"""The package's shape: imports point down the data flow, library errors speak in arguments
(the CLI in flags), and HOOKDUMP_DEBUG=1 shows a model's own traceback."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from clitools import assert_usage_error, invoke

import hookdump
from hookdump.engine.options import RunOptions
from hookdump.engine.runner import run
from hookdump.inputs.samples import InputOptions
from hookdump.model.prepare import ModelOptions
from hookdump.store.write.writer import DumpOptions

ROOT = Path(__file__).parent.parent
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LINT_IMPORTS, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip


@pytest.mark.skipif(not Path(LINT_IMPORTS).exists(), reason="import-linter is not installed")
def test_the_layers_contract_holds_and_catches_an_upward_import(tmp_path: Path) -> None:
    assert _lint_imports(ROOT).returncode == 0
    copy = tmp_path / "project"
    shutil.copytree(
        ROOT / "hookdump", copy / "hookdump", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", copy)
    writer = copy / "hookdump" / "store" / "write" / "writer.py"
    original = writer.read_text()
    writer.write_text(original + "\nfrom hookdump.engine import runner  # noqa\n")  # up to run/
    result = _lint_imports(copy)
    assert result.returncode != 0
    assert "hookdump.store is not allowed to import hookdump.engine" in result.stdout
    # the write wing reaching into the read wing
    writer.write_text(original + "\nfrom hookdump.store.read import reader  # noqa\n")
    result = _lint_imports(copy)
    assert result.returncode != 0
    assert "hookdump.store.write is not allowed to import hookdump.store.read" in result.stdout


def test_library_errors_name_arguments_and_the_cli_names_flags(in_tests_dir: Path) -> None:
    from tiny_models import TwoLinear

    with pytest.raises(hookdump.HookdumpError) as caught:
        hookdump.capture(TwoLinear(), reduce="median")
    assert (
        str(caught.value) == "reduce 'median' is not one of none, mean, max, flatten, first, last"
    )
    with pytest.raises(hookdump.HookdumpError) as caught:
        run(RunOptions(ModelOptions("tiny_models:TwoLinear"), input=InputOptions(batch_size=0)))
    assert str(caught.value) == "batch_size 0 must be at least 1"
    with pytest.raises(hookdump.HookdumpError) as caught:
        run(RunOptions(ModelOptions("tiny_models:TwoLinear"), dump=DumpOptions(out=in_tests_dir)))
    assert "overwrite=True only replaces dumps" in str(caught.value)  # named as in Python
    assert_usage_error(invoke("run", "tiny_models:TwoLinear", "--reduce", "median"),
                       "--reduce 'median' is not one of")  # fmt: skip
    assert_usage_error(invoke("run", "tiny_models:TwoLinear", "-b", "0"), "--batch-size 0")
    line = assert_usage_error(invoke("run", "tiny_models:TwoLinear", "-o", str(in_tests_dir)))
    assert "--overwrite only replaces dumps" in line


def test_hookdump_debug_shows_the_models_own_traceback(
    in_tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["run", "tiny_models:FailsMidway", "-q"]
    assert_usage_error(invoke(*args), "raised RuntimeError: shapes do not line up")
    monkeypatch.setenv("HOOKDUMP_DEBUG", "1")
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith("Error: the forward pass of tiny_models:FailsMidway raised")
    assert lines[1] == "Traceback (most recent call last):"
    assert any("in forward" in line and "tiny_models.py" in line for line in lines)
    assert lines[-2:] == ["RuntimeError: shapes do not line up", "second line of the message"]


def test_a_warning_names_flags_in_the_cli_and_arguments_in_the_library(
    in_tests_dir: Path, tmp_path: Path
) -> None:
    from safetensors.torch import save_file
    from tiny_models import TwoLinear

    state = TwoLinear().state_dict()
    del state["linear_2.bias"]
    save_file(state, tmp_path / "w.safetensors")
    weights = str(tmp_path / "w.safetensors")
    result = invoke("run", "tiny_models:TwoLinear", "--weights", weights, "--no-strict")
    assert result.exit_code == 0
    assert f"warning: --weights {weights}: 1 key missing (linear_2.bias)" in result.stderr
    options = RunOptions(ModelOptions("tiny_models:TwoLinear", weights=weights, strict=False))
    warnings = run(options).warnings
    assert warnings[0].startswith(f"weights {weights}: 1 key missing (linear_2.bias)")


def _assigned_attributes(node: ast.AST) -> Iterator[ast.Attribute]:
    """The attributes an assignment statement sets (`a.b = `, `a.b, c = `, `a.b += `)."""
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    else:
        return
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets.extend(target.elts)
        elif isinstance(target, ast.Attribute):
            yield target


def _foreign_assignments(package: Path) -> list[str]:
    """`x.attr = ...` in a module where no class has `attr`, while a class of another
    module of `package` does: an object finished from outside its own module."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(package.rglob("*.py"))}
    owners: dict[str, set[Path]] = {}
    for path, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            fields = {
                item.target.id
                for item in cls.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
            for node in ast.walk(cls):
                fields |= {
                    a.attr
                    for a in _assigned_attributes(node)
                    if isinstance(a.value, ast.Name) and a.value.id == "self"
                }
            for name in fields:
                owners.setdefault(name, set()).add(path)
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            for attribute in _assigned_attributes(node):
                value = attribute.value
                if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                    continue
                owned = owners.get(attribute.attr, set())
                if owned and path not in owned:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno}: "
                                 f"{ast.unparse(attribute)}")  # fmt: skip
    return found


def test_no_object_is_finished_from_outside_its_own_module(tmp_path: Path) -> None:
    """Results, feeds, models and dumps are built whole by the module that owns them; the
    check itself catches a planted `feed.first = ...` in another module."""
    assert _foreign_assignments(ROOT / "hookdump") == []
    planted = tmp_path / "pkg"
    planted.mkdir()
    (planted / "spec.py").write_text("class Feed:\n    first: int = 0\n")
    (planted / "text.py").write_text("def make(feed):\n    feed.first = 3\n")
    assert _foreign_assignments(planted) == ["pkg/text.py:2: feed.first"]


def test_no_behaviour_is_dispatched_by_a_built_name() -> None:
    """No `getattr(obj, f"_on_{kind}")`: a handler has a call site anyone can find."""
    built = []
    for path in sorted((ROOT / "hookdump").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.JoinedStr | ast.BinOp)
            ):
                built.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert built == []


MAX_ATTRIBUTES = 12


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    """A class's instance attributes: `self.x = ...` anywhere in it, and a dataclass's
    annotated fields (ClassVar aside)."""
    dataclass = any("dataclass" in ast.unparse(d) for d in cls.decorator_list)
    names = {
        item.target.id
        for item in cls.body
        if dataclass
        and isinstance(item, ast.AnnAssign)
        and isinstance(item.target, ast.Name)
        and "ClassVar" not in ast.unparse(item.annotation)
    }
    for node in ast.walk(cls):
        names |= {
            a.attr
            for a in _assigned_attributes(node)
            if isinstance(a.value, ast.Name) and a.value.id == "self"
        }
    return names


def _large_classes(package: Path) -> dict[str, int]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        for cls in (
            n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ClassDef)
        ):
            count = len(_instance_attributes(cls))
            if count > MAX_ATTRIBUTES:
                found[f"{path.relative_to(package.parent)}:{cls.name}"] = count
    return found


def test_no_class_holds_more_than_twelve_instance_attributes(tmp_path: Path) -> None:
    """A class that needs more is doing more than one job; the check itself counts a
    planted class of thirteen, fields and `self.` assignments together."""
    assert _large_classes(ROOT / "hookdump") == {}
    planted = tmp_path / "pkg"
    planted.mkdir()
    fields = "".join(f"    f{i}: int = 0\n" for i in range(7))
    sets = "".join(f"        self.s{i} = 0\n" for i in range(6))
    (planted / "big.py").write_text(
        f"from dataclasses import dataclass\n@dataclass\nclass Big:\n{fields}"
        f"    def __post_init__(self):\n{sets}"
    )
    assert _large_classes(planted) == {"pkg/big.py:Big": 13}


def test_the_import_graph_has_no_circle() -> None:
    """Every module's imports (those under TYPE_CHECKING too) point one way: no module
    reaches itself through others (the row readers take `store.read.reader.ShardReader`, not
    the `Dump` that imports them)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("hookdump")
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(imported) == 1:
                circle = [*path[path.index(imported) :], imported]
                pytest.fail("an import circle: " + " -> ".join(circle))
            if imported not in state:
                walk(imported, [*path, imported])
        state[module] = 2

    for module in sorted(graph.modules):
        if module not in state:
            walk(module, [module])
    assert len(state) > 50


def test_architecture_md_names_every_module() -> None:
    """The map is true: a new module is named where it lives, with what it does."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    unnamed = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "hookdump").rglob("*.py"))
        if path.name != "__init__.py" and path.name not in text
    ]
    assert unnamed == []


def test_no_function_body_runs_past_sixty_lines() -> None:
    """Each function reads in one sitting: its body, less its docstring (a Typer command's
    options and `hookdump.dump`'s keywords are its signature), at most 60 lines."""
    long = []
    for path in sorted((ROOT / "hookdump").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            if body and (body[-1].end_lineno or 0) - body[0].lineno + 1 > 60:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert long == []


def test_a_dump_shows_a_small_documented_face() -> None:
    """`Dump` is a thin read-only Mapping over a ShardReader: tab completion in a notebook
    shows what the README documents, not shard primitives."""
    from hookdump.store.read.dump import Dump

    own = {name for name in vars(Dump) if not name.startswith("_")}
    assert own == {
        "batches",
        "complete",
        "consumed",
        "dataset",
        "info",
        "keys",
        "num_samples",
        "row",
        "sample_ids",
        "stats",
    }
    public = {name for name in dir(Dump) if not name.startswith("_")}
    assert public - own == {"get", "items", "values"}  # Mapping's
    instance = set(Dump.__init__.__code__.co_names) & {"path", "manifest", "reader"}
    assert instance == {"path", "manifest", "reader"}
