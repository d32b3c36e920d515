"""Each command's start-up, as a user waits for it (issue 47): a fresh process per command
on a tiny dump and model, medians of `--reps` runs, beside `python -c "import torch"` (what
every command that reads tensors pays) and `hookdump --help` (nothing but the CLI), with
the heavy packages each command imports (`-X importtime`).

    python benchmarks/startup.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "torchvision", "transformers", "matplotlib", "scipy", "sympy", "timm")
TESTS = Path(__file__).parents[1] / "tests"


def _timed(argv: list[str], cwd: Path, reps: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return round(statistics.median(times), 2)


def _imports(argv: list[str], cwd: Path) -> list[str]:
    """The heavy top-level packages the command imports."""
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    run = [argv[0], "-X", "importtime", *argv[1:]]
    err = subprocess.run(run, cwd=cwd, env=env, capture_output=True, text=True).stderr
    names = {line.split("|")[-1].strip() for line in err.splitlines() if "|" in line}
    return [name for name in HEAVY if name in names]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    reps = parser.parse_args().reps
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        hd = [py, "-m", "hookdump"]
        env = {**os.environ, "PYTHONPATH": str(TESTS)}
        made = [*hd, "run", "tiny_models:TwoLinear", "-n", "8", "-o", "a", "-q"]
        subprocess.run(made, cwd=cwd, env=env, check=True)
        commands = {
            "python -c 'import torch'": [py, "-c", "import torch"],
            "hookdump --help": [*hd, "--help"],
            "inspect DUMP": [*hd, "inspect", "a"],
            "diff DUMP DUMP": [*hd, "diff", "a", "a"],
            "show DUMP KEY -o x.png": [*hd, "show", "a", "linear_1", "-o", "x.png"],
            "export DUMP --to npy": [*hd, "export", "a", "npy", "--to", "npy", "--overwrite"],
            "layers module:Class": [*hd, "layers", "tiny_models:TwoLinear"],
            "layers resnet18": [*hd, "layers", "resnet18"],
            "models": [*hd, "models"],
        }
        figures = {
            name: {"wall s": _timed(argv, cwd, reps), "imports": _imports(argv, cwd)}
            for name, argv in commands.items()
        }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
