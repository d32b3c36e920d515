"""hookdump as a user sees it: fresh `hookdump run` processes, wall time, against the
hand-written loop it replaces (`handwritten.py`) and against the physical limit.

    python benchmarks/process.py                 # all four jobs, 5 paired runs each
    python benchmarks/process.py --reps 3 --only multi --json figures.json

Each repetition runs, one after the other and each as a fresh process: hookdump; the
loop, then `sync` (its bytes are in the page cache: timed apart, so the loop is reported
both as it is and followed by `sync`); the bare forward passes; `dd bs=8M oflag=direct
conv=fsync` of as many bytes as hookdump wrote. The limit is start-up (the bare process's
wall time less its forward passes: interpreter, imports, model) plus the larger of the
forward passes and the dd (`--page-cache` adds hookdump with `HOOKDUMP_DIRECT_IO=0`). Before
every timed step the last one's files are deleted and
synced, so no step pays for another's writeback. Ratios are per repetition, then the
median (min-max); lower is better.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# the console script, as users run it (or, where hookdump is not installed, `python -m`)
SCRIPT = Path(sys.executable).with_name("hookdump")
HOOKDUMP = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hookdump"]
IMAGES = {  # name: what both hookdump and the loop are asked for, of resnet50 on random input
    "ci": ["--layers", "layer1.*", "--batch-size", "8"],
    "big": ["--batch-size", "32"],
    "multi": ["--batch-size", "16", "--num-samples", "64"],
}
JOBS = [*IMAGES, "tokens"]


def job_args(name: str, scratch: Path) -> tuple[list[str], list[str]]:
    """What `hookdump run` and the loop are given for a job. `tokens`: a GPT-2-small-shaped
    model (random weights, tokenizer trained here; see text.py), every block's output
    per token, 64 windows of 128 tokens in batches of 8 (302 MB)."""
    if name in IMAGES:
        return ["resnet50", *IMAGES[name]], IMAGES[name]
    folder, corpus = scratch / "gpt2", scratch / "corpus.txt"
    if not folder.exists():
        import text

        text.synthetic_corpus(corpus, 400, seed=0)
        text.build_model(folder, corpus)
    blocks = ["--layers", "h.[0-9]", "--layers", "h.1[01]"]
    common = [*blocks, "--text", str(corpus), "--context-size", "128"]
    common += ["--batch-size", "8", "--num-samples", "64"]
    return [f"hf:{folder}", *common, "--per-token"], ["--model", f"hf:{folder}", *common]


def run_measured(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall seconds, peak resident memory (GB) and stdout of a fresh process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        environment = {**os.environ, **(env or {})}
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=environment)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode:
            raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{err.read()}")
        return wall, usage.ru_maxrss * 1024 / 1e9, out.read()


def settle(*paths: Path) -> None:
    """Delete the last step's files and put everything on disk, untimed."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    os.sync()
    time.sleep(1)


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir())


def one_rep(name: str, scratch: Path, device: str, page_cache: bool) -> dict[str, float]:
    hd_out, loop_out, dd_file = scratch / "hd", scratch / "loop", scratch / "dd"
    figures: dict[str, float] = {}
    on = ["--device", device]
    hd_args, loop_args = job_args(name, scratch)
    hookdump = [*HOOKDUMP, "run", *hd_args, *on, "--out", str(hd_out)]

    settle(hd_out, loop_out, dd_file)
    wall, peak, _ = run_measured(hookdump)
    figures |= {"hookdump": wall, "hookdump_peak_gb": peak}
    written = folder_bytes(hd_out)
    figures["gb"] = written / 1e9
    if page_cache:  # the same run written through the page cache (shards still synced)
        settle(hd_out)
        wall, _, _ = run_measured(hookdump, env={"HOOKDUMP_DIRECT_IO": "0"})
        figures["hookdump_page_cache"] = wall

    settle(hd_out)
    loop = [sys.executable, str(HERE / "handwritten.py"), *loop_args, *on]
    wall, peak, out = run_measured([*loop, str(loop_out)])
    start = time.perf_counter()
    os.sync()
    synced = time.perf_counter() - start
    figures |= {"loop": wall, "loop_sync": wall + synced, "loop_peak_gb": peak}
    figures["loop_save"] = json.loads(out)["save"]

    # the bare forward writes nothing; the loop's files are deleted only after it, so that
    # every writing step (hookdump, the loop, dd) starts just after a dump's worth of files
    # was deleted (this disk is mounted with `discard`: a deletion slows the writes after it)
    wall, _, out = run_measured([*loop, "--bare", str(scratch / "bare")])
    phases = json.loads(out)
    figures |= {"forward": phases["forward"], "startup": wall - phases["forward"]}

    settle(loop_out)
    blocks = math.ceil(written / (8 << 20))
    dd = ["dd", "if=/dev/zero", f"of={dd_file}", "bs=8M", f"count={blocks}"]
    wall, _, _ = run_measured([*dd, "oflag=direct", "conv=fsync", "status=none"])
    figures["dd"] = wall
    figures["limit"] = figures["startup"] + max(figures["forward"], wall)
    settle(dd_file)
    return figures


def summary(reps: list[dict[str, float]]) -> dict[str, Any]:
    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"

    ratios = {
        "vs loop": [r["hookdump"] / r["loop"] for r in reps],
        "vs loop + sync": [r["hookdump"] / r["loop_sync"] for r in reps],
        "vs limit": [r["hookdump"] / r["limit"] for r in reps],
    }
    if "hookdump_page_cache" in reps[0]:
        ratios["page cache vs O_DIRECT"] = [r["hookdump_page_cache"] / r["hookdump"] for r in reps]
    return {
        "ratios": {name: spread(values) for name, values in ratios.items()},
        "seconds": {name: spread([r[name] for r in reps]) for name in reps[0]},
    }


def help_seconds(reps: int) -> dict[str, Any]:
    """`hookdump --help`: median wall time, and whether torch was imported for it."""
    times = [run_measured([*HOOKDUMP, "--help"])[0] for _ in range(reps)]
    probe = [sys.executable, "-X", "importtime", "-c", "from hookdump.cli import main; main()"]
    imports = subprocess.run([*probe, "--help"], capture_output=True, text=True).stderr
    torch = any(line.rsplit("|", 1)[-1].strip() == "torch" for line in imports.splitlines())
    return {"seconds": round(statistics.median(times), 3), "imports torch": torch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", default=",".join(JOBS), help="of " + ",".join(JOBS))
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--page-cache", action="store_true", help="also time hookdump with HOOKDUMP_DIRECT_IO=0"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="hookdump-bench-", dir=os.environ.get("BENCH_DIR")))
    results: dict[str, Any] = {"machine": f"{os.cpu_count()} CPU cores, device {args.device}"}
    try:
        results["help"] = help_seconds(args.reps)
        print("help", json.dumps(results["help"]), flush=True)
        for name in args.only.split(","):
            reps = []
            for rep in range(args.reps):
                reps.append(one_rep(name, scratch, args.device, args.page_cache))
                print(f"  {name} {rep + 1}/{args.reps}", json.dumps(reps[-1]), flush=True)
            results[name] = {"reps": reps, **summary(reps)}
            print(name, json.dumps(summary(reps), indent=2), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
