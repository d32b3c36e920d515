"""Token rows of a language model: hookdump against a bare forward and a hand-written loop.

    python benchmarks/text.py                       # throughput, memory, reading; 5 pairs
    python benchmarks/text.py --reps 7 --only reading

A GPT-2-small-shaped model with random weights (12 layers, width 768), a byte-level BPE
tokenizer trained here on a synthetic corpus, windows of 128 tokens, batches of 8, every
block's output dumped with `--per-token`:

- throughput: tokens/s of `hookdump.run` (tokenizer loading and tokenizing counted, the
  model's build not: it is built once for the references too) against the bare forward on
  the same, already tokenized, windows, and against a hand-written loop
  (`output_hidden_states=True`, the mask, `save_file` per batch, its tokenizing counted);
- memory: the peak RSS of a fresh `hookdump run` over a corpus 10 times larger (and so 10
  times the tokens) against the one of 1 times;
- reading: rows/s of `Dump.batches(shuffle=True)` against in-order reading of the same dump,
  its pages dropped from the page cache before each pass (`benchmarks/reader.py` measures
  the reader against `dd`);
- statistics: the seconds of the same dump with and without the per-feature statistics
  made while it is written (`store/features.py`);
- padding: one document per sample with `--per-token` on documents of 2 to 80 words: the
  forward loop's seconds with every batch padded to `--max-length` (as before dynamic
  padding), padded to its longest document, and that with `--sort-by-length`, and the
  fraction of the positions computed that were real tokens.

Runs are paired (A B A B ...) after a warm-up round; figures are medians, with the spread
(min-max) beside them.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import handwritten
import harness
import torch

CONTEXT, BATCH, LAYERS = 128, 8, ["h.[0-9]", "h.1[01]"]  # the 12 blocks, not their parts
SAMPLES = 64  # windows per throughput run: 8 batches, 8192 tokens
MEMORY_DOCUMENTS = 10  # the 1x memory run's corpus (about 20 windows); 10x: 100 documents


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def paired(fns: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Each function's results over `reps` rounds, run in turns after a warm-up round."""
    results: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(reps + 1):
        for name, fn in fns.items():
            os.sync()  # no run pays for the writeback of the one before
            value = fn()
            if rep:
                results[name].append(value)
    return results


def synthetic_corpus(path: Path, documents: int, seed: int) -> None:
    """Documents of 20-300 words drawn (Zipf-like) from 5000 made-up words."""
    rng = random.Random(seed)
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(5000)]
    weights = [1 / (rank + 1) for rank in range(len(words))]
    with path.open("w") as out:
        for _ in range(documents):
            out.write(" ".join(rng.choices(words, weights, k=rng.randint(20, 300))) + "\n")


def build_model(folder: Path, corpus: Path) -> None:
    """A GPT-2-small-shaped model with random weights and a byte-level BPE tokenizer trained
    on the corpus, saved as a Hugging Face folder."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    torch.manual_seed(0)
    transformers.GPT2Model(transformers.GPT2Config(n_positions=CONTEXT)).save_pretrained(folder)
    bpe = ByteLevelBPETokenizer()
    bpe.train([str(corpus)], vocab_size=4096, special_tokens=["<|endoftext|>"])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    fast.save_pretrained(folder)


class Job:
    """The model folder, the corpus and the model built once for the references."""

    def __init__(self, scratch: Path) -> None:
        import transformers

        self.scratch = scratch
        self.corpus = scratch / "corpus.txt"
        synthetic_corpus(self.corpus, 400, seed=0)
        self.folder = scratch / "gpt2"
        build_model(self.folder, self.corpus)
        self.model = transformers.GPT2Model.from_pretrained(self.folder).eval()
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.folder)
        self.windows = pack(self.tokenizer, self.corpus, SAMPLES)
        if len(self.windows) < SAMPLES:
            raise SystemExit(f"the corpus makes only {len(self.windows)} windows")

    def hookdump(
        self, out: str, samples: int = SAMPLES, shard_bytes: int = 1 << 30
    ) -> dict[str, float]:
        from hookdump.engine.options import RunOptions
        from hookdump.engine.runner import run
        from hookdump.hooks.options import CaptureOptions
        from hookdump.hooks.tokens import TokenOptions
        from hookdump.inputs.samples import InputOptions
        from hookdump.inputs.text import TextOptions
        from hookdump.model.prepare import ModelOptions
        from hookdump.store.write.writer import DumpOptions

        options = RunOptions(
            ModelOptions(f"hf:{self.folder}"), CaptureOptions(layers=tuple(LAYERS)),
            InputOptions(batch_size=BATCH, num_samples=samples),
            TextOptions(str(self.corpus), context_size=CONTEXT), TokenOptions(),
            DumpOptions(self.scratch / out, overwrite=True, shard_bytes=shard_bytes),
        )  # fmt: skip
        return run(options).timings


def pack(tokenizer: Any, corpus: Path, samples: int) -> list[list[int]]:
    """The contract's packed windows, as a hand-written loop makes them: BOS, then the
    next CONTEXT - 1 tokens of the documents joined with EOS."""
    return handwritten.pack(tokenizer, corpus, CONTEXT, samples)


def bench_throughput(job: Job, reps: int) -> dict[str, Any]:
    import transformers
    from safetensors.torch import save_file

    tokens = SAMPLES * CONTEXT
    batches = [torch.tensor(job.windows[i : i + BATCH]) for i in range(0, SAMPLES, BATCH)]

    def bare() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            for ids in batches:
                job.model(input_ids=ids, attention_mask=torch.ones_like(ids))
        return tokens / (time.perf_counter() - start)

    def hookdump() -> float:
        timings = job.hookdump("hd")
        return tokens / (timings["loop"] + timings["finish"])  # the model's build left out

    def hand_written() -> float:
        out = job.scratch / "hand"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        start = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(job.folder)
        windows = pack(tokenizer, job.corpus, SAMPLES)
        for first in range(0, SAMPLES, BATCH):
            ids = torch.tensor(windows[first : first + BATCH])
            mask = torch.ones_like(ids)
            with torch.inference_mode():
                hidden = job.model(input_ids=ids, attention_mask=mask,
                                   output_hidden_states=True).hidden_states  # fmt: skip
            real = mask.bool()
            rows = {f"h.{i}": h[real].contiguous() for i, h in enumerate(hidden[1:])}
            rows["token_ids"] = ids[real]
            save_file(rows, str(out / f"{first:06d}.safetensors"))
        return tokens / (time.perf_counter() - start)

    runs = paired({"bare_forward": bare, "hookdump": hookdump, "hand_written": hand_written},
                  reps)  # fmt: skip
    ratios = [h / b for h, b in zip(runs["hookdump"], runs["bare_forward"], strict=True)]
    against_loop = [h / w for h, w in zip(runs["hookdump"], runs["hand_written"], strict=True)]
    return {
        "tokens_per_run": tokens,
        **{f"{name}_tokens_per_s": spread(values) for name, values in runs.items()},
        "hookdump_vs_bare_forward": spread(ratios),
        "hookdump_vs_hand_written": spread(against_loop),
    }


def bench_statistics(job: Job, reps: int) -> dict[str, Any]:
    """The per-feature statistics' cost: the token-row dump's seconds (loop and finish)
    with them, and without (`KeySummary.add_features` a no-op and `batch_stats` answering
    None: the whole-key statistics then made the older way, one chunked pass)."""
    from hookdump.store import stats

    real = stats.KeySummary.add_features, stats.batch_stats

    def seconds(timings: dict[str, float]) -> float:
        return timings["loop"] + timings["finish"]

    def with_stats() -> float:
        return seconds(job.hookdump("hd"))

    def without() -> float:
        stats.KeySummary.add_features = lambda *_, **__: None  # type: ignore[method-assign]
        stats.batch_stats = lambda _: None
        try:
            return seconds(job.hookdump("hd"))
        finally:
            stats.KeySummary.add_features, stats.batch_stats = real  # type: ignore[method-assign]

    runs = paired({"without_statistics": without, "with_statistics": with_stats}, reps)
    ratio = [w / o for w, o in zip(runs["with_statistics"], runs["without_statistics"],
                                   strict=True)]  # fmt: skip
    return {
        **{f"{name}_s": spread(values) for name, values in runs.items()},
        "with_vs_without": spread(ratio),
    }


def peak_rss_mib(args: list[str]) -> float:
    """The peak RSS of a fresh `hookdump` process (VmHWM: its own, not the parent's)."""
    code = (
        "import re, sys\nfrom hookdump.cli import app\n"
        f"try:\n    app({args!r})\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "status = open('/proc/self/status').read()\n"
        "print(re.search(r'VmHWM:\\s+(\\d+)', status).group(1), file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(proc.stderr.strip().splitlines()[-1]) / 1024


def bench_memory(job: Job, reps: int) -> dict[str, Any]:
    """The whole corpus is fed (no --num-samples): 10 times the corpus, 10 times the tokens."""
    corpora = {}
    for scale in (1, 10):
        corpora[scale] = job.scratch / f"corpus-{scale}x.txt"
        synthetic_corpus(corpora[scale], MEMORY_DOCUMENTS * scale, seed=scale)

    def peak(scale: int) -> Callable[[], float]:
        args = ["run", f"hf:{job.folder}", "--text", str(corpora[scale]), "--context-size",
                str(CONTEXT), "--per-token", *(a for p in LAYERS for a in ("-l", p)), "-b",
                str(BATCH), "-o", str(job.scratch / "mem"), "--overwrite", "-q"]  # fmt: skip
        return lambda: peak_rss_mib(args)

    windows = {s: len(pack(job.tokenizer, corpora[s], 10**9)) for s in corpora}
    runs = paired({"1x": peak(1), "10x": peak(10)}, reps)
    ratios = [b / a for a, b in zip(runs["1x"], runs["10x"], strict=True)]
    return {
        "tokens_1x": windows[1] * CONTEXT,
        "tokens_10x": windows[10] * CONTEXT,
        "peak_rss_1x_mib": spread(runs["1x"]),
        "peak_rss_10x_mib": spread(runs["10x"]),
        "ratio": spread(ratios),
    }


def bench_reading(job: Job, reps: int) -> dict[str, Any]:
    import hookdump

    # shards of 64 MiB: a large dump's many shards, scaled down to this one's 300 MB
    job.hookdump("read", shard_bytes=64 << 20)
    dump = hookdump.load(job.scratch / "read")
    keys = ["h.5", "__token_ids__"]

    def rows_per_s(shuffle: bool) -> Callable[[], float]:
        def one_pass() -> float:
            harness.drop_from_page_cache(dump.path)
            start, rows = time.perf_counter(), 0
            for batch in dump.batches(keys, batch_size=4096, shuffle=shuffle, seed=0):
                rows += len(batch["h.5"])
            assert rows == dump.num_samples
            return rows / (time.perf_counter() - start)

        return one_pass

    runs = paired({"in_order": rows_per_s(False), "shuffled": rows_per_s(True)}, reps)
    ratios = [s / o for o, s in zip(runs["in_order"], runs["shuffled"], strict=True)]
    return {
        "rows": dump.num_samples,
        "shards": len(dump.manifest.shards),
        **{f"{name}_rows_per_s": spread(values) for name, values in runs.items()},
        "shuffled_vs_in_order": spread(ratios),
    }


def bench_padding(job: Job, reps: int) -> dict[str, Any]:
    import hookdump.engine.runner as runner
    from hookdump.engine.options import RunOptions
    from hookdump.hooks.options import CaptureOptions
    from hookdump.hooks.tokens import TokenOptions
    from hookdump.inputs.samples import InputOptions
    from hookdump.inputs.text import TextOptions, text_feed
    from hookdump.model.prepare import ModelOptions
    from hookdump.store.write.writer import DumpOptions

    rng = random.Random(1)
    words = job.corpus.read_text().split()
    corpus = job.scratch / "varied.txt"
    corpus.write_text("".join(" ".join(rng.choices(words, k=rng.randint(2, 80))) + "\n"
                              for _ in range(SAMPLES)))  # fmt: skip
    fractions: dict[str, float | None] = {}

    def static(*args: Any, **kwargs: Any) -> Any:
        return text_feed(*args, **{**kwargs, "dynamic": False})

    def loop_seconds(mode: str) -> Callable[[], float]:
        def once() -> float:
            options = RunOptions(
                ModelOptions(f"hf:{job.folder}"), CaptureOptions(layers=tuple(LAYERS)),
                InputOptions(batch_size=BATCH),
                TextOptions(str(corpus), max_length=CONTEXT, sort_by_length=mode == "sorted"),
                TokenOptions(), DumpOptions(job.scratch / "padding", overwrite=True),
            )  # fmt: skip
            real_feed = runner.text_feed
            if mode == "max_length":  # every batch padded to --max-length, as before
                runner.text_feed = static  # type: ignore[assignment]
            try:
                result = runner.run(options)
            finally:
                runner.text_feed = real_feed
            fractions[mode] = result.real_tokens
            return result.timings["loop"]

        return once

    modes = ("max_length", "longest", "sorted")
    runs = paired({mode: loop_seconds(mode) for mode in modes}, reps)
    return {
        "documents": SAMPLES,
        "real_token_fraction": fractions,
        **{f"{mode}_loop_s": spread(runs[mode]) for mode in modes},
        "speed_up_longest": spread(
            [a / b for a, b in zip(runs["max_length"], runs["longest"], strict=True)]
        ),
        "speed_up_sorted": spread(
            [a / b for a, b in zip(runs["max_length"], runs["sorted"], strict=True)]
        ),
    }


BENCHMARKS = {
    "statistics": bench_statistics,
    "throughput": bench_throughput, "memory": bench_memory, "reading": bench_reading,
    "padding": bench_padding,
}  # fmt: skip


if __name__ == "__main__":
    harness.main(__doc__.splitlines()[0], BENCHMARKS, Job)
