"""Training while the dump is written (issue 46): a `hookdump run` of token rows and a
small sparse autoencoder trained on them in another process, through `hookdump.follow(...,
consume=True)` under `--max-disk`, against dumping first and training after.

    python benchmarks/follow.py --reps 1

A 4-layer GPT-2 shape (width 256) with random weights and a BPE tokenizer trained here;
windows of 128 tokens, `h.3` as token rows, shards of 8 MiB, a budget of 32 MiB. The
trainer: an SAE of 8x width, batches of 1024, one Adam step each. Figures, fresh processes:

- the run alone, and the trainer alone on the finished dump (`Dump.batches`, in order);
- the two together under the budget: wall time until both are done, the peak bytes of
  shards under `--out` (sampled every 20 ms), and the trainer's rows;
- ratios: together / the longer alone (the issue's target: 1.1), together / one after
  the other;
- `pinned`: the same with the run on core 0 and the trainer on core 1, one thread each,
  alone and together: the two on separate devices, as the target assumes.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness

sys.path.insert(0, str(Path(__file__).parent))
import contextlib

from text import synthetic_corpus

SHARD, BUDGET = os.environ.get("FOLLOW_SHARD", "8MiB"), "32MiB"  # FOLLOW_SHARD: another size
TRAINER = """
import sys, time, torch, hookdump
mode, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
sae = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 256))
optimiser = torch.optim.Adam(sae.parameters(), lr=1e-3)
if mode == "follow":
    batches = hookdump.follow(out, ["h.3"], 1024, consume=True)
else:
    batches = hookdump.load(out).batches(["h.3"], 1024)
rows = 0
for batch in batches:
    x = batch["h.3"]
    loss = (sae(x) - x).pow(2).mean()
    optimiser.zero_grad(); loss.backward(); optimiser.step()
    rows += len(x)
print(rows)
"""


class Job:
    def __init__(self, scratch: Path) -> None:
        import torch
        import transformers
        from tokenizers import ByteLevelBPETokenizer

        self.scratch = scratch
        self.corpus = scratch / "corpus.txt"
        synthetic_corpus(self.corpus, 300, seed=0)
        self.folder = scratch / "gpt2"
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=128)
        transformers.GPT2Model(config).save_pretrained(self.folder)
        bpe = ByteLevelBPETokenizer()
        bpe.train([str(self.corpus)], vocab_size=4096, special_tokens=["<|endoftext|>"])
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
        )
        fast.save_pretrained(self.folder)

        self.pinned = False  # each process on a core of its own, one thread (`pinned`)

    def run(self, out: Path, *extra: str) -> subprocess.Popen[bytes]:
        args = ["run", f"hf:{self.folder}", "--text", str(self.corpus), "--context-size",
                "128", "--per-token", "--layers", "h.3", "--shard-size", SHARD,
                "--out", str(out), "--overwrite", "-q"]  # fmt: skip
        return self._start([sys.executable, "-m", "hookdump", *args, *extra], 0)

    def trainer(self, mode: str, out: Path) -> subprocess.Popen[bytes]:
        return self._start([sys.executable, "-c", TRAINER, mode, str(out)], 1)

    def _start(self, argv: list[str], core: int) -> subprocess.Popen[bytes]:
        """A process; `pinned`: on core `core` alone, with one thread (as if each of the
        two had a device of its own)."""
        if not self.pinned:
            return subprocess.Popen(argv, stdout=subprocess.PIPE)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        return subprocess.Popen(argv, stdout=subprocess.PIPE, env=env,
                                preexec_fn=lambda: os.sched_setaffinity(0, {core}))  # fmt: skip


def _wait(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        if process.wait() != 0:
            raise SystemExit(f"{process.args[:3]} failed")


def _shard_bytes(out: Path) -> int:
    total = 0
    for path in out.glob("shard-*"):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def together(job: Job, reps: int) -> dict[str, Any]:
    alone_run, alone_train, both, peaks = [], [], [], []
    for _ in range(reps):
        out = job.scratch / "alone"
        started = time.perf_counter()
        _wait(job.run(out))
        alone_run.append(time.perf_counter() - started)
        started = time.perf_counter()
        _wait(job.trainer("read", out))
        alone_train.append(time.perf_counter() - started)
        live = job.scratch / "live"
        for path in live.glob("*") if live.exists() else []:
            path.unlink()
        started = time.perf_counter()
        run, trainer = job.run(live, "--max-disk", BUDGET), job.trainer("follow", live)
        peak = 0
        while run.poll() is None or trainer.poll() is None:
            if live.is_dir():
                peak = max(peak, _shard_bytes(live))
            time.sleep(0.02)
        _wait(run, trainer)
        both.append(time.perf_counter() - started)
        peaks.append(peak)
    run_s, train_s, both_s = (statistics.median(v) for v in (alone_run, alone_train, both))
    return {
        "run alone s": round(run_s, 2),
        "trainer alone s (Dump.batches, after)": round(train_s, 2),
        "together s (follow, consume, --max-disk 32MiB)": round(both_s, 2),
        "together / longer alone": round(both_s / max(run_s, train_s), 3),
        "together / one after the other": round(both_s / (run_s + train_s), 3),
        "peak shard MiB under --out": round(max(peaks) / 2**20, 1),
        "budget + one shard MiB": 32 + int(SHARD.removesuffix("MiB")),
        "cores": os.cpu_count(),
    }


def pinned(job: Job, reps: int) -> dict[str, Any]:
    """`together` with the run on core 0 and the trainer on core 1, one thread each: two
    devices' worth of compute, which is what running them at once can overlap."""
    job.pinned = True
    try:
        return together(job, reps)
    finally:
        job.pinned = False


if __name__ == "__main__":
    harness.main(__doc__ or "", {"together": together, "pinned": pinned}, Job)
