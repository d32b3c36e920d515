"""The loop hookdump replaces, as a user writes it: forward hooks that clone what the
modules return, then `safetensors.torch.save_file` once per batch. With `--bare`, the
forward passes alone (no hooks, nothing saved): a piece of the physical limit.

    python benchmarks/handwritten.py OUT --batch-size 16 --num-samples 64 [--layers 'layer1.*']
    python benchmarks/handwritten.py OUT --model hf:FOLDER --text CORPUS --layers 'h.*' ...

A torchvision model gets seeded random images; an `hf:` model folder gets `--text`, packed
into windows of `--context-size` tokens (BOS, then the documents joined with EOS), and its
hooks keep one row per token (block outputs flattened to [batch x tokens, width]).

Run as a fresh process by `process.py`; prints its phases' seconds as one JSON line.
"""

from __future__ import annotations

import time

started = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
from collections import Counter  # noqa: E402
from fnmatch import fnmatchcase  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torchvision  # noqa: E402
from safetensors.torch import save_file  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument(
        "--layers", action="append", help="globs over module names; default: every leaf"
    )
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-samples", type=int)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--text", type=Path, help="a corpus, for an hf: model")
    parser.add_argument("--context-size", type=int, default=128)
    parser.add_argument("--bare", action="store_true", help="forward passes only")
    args = parser.parse_args()
    imported = time.perf_counter()

    torch.manual_seed(0)
    if args.model.startswith("hf:"):
        import transformers

        folder = args.model.removeprefix("hf:")
        model = transformers.AutoModel.from_pretrained(folder).eval().to(args.device)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    else:
        model = getattr(torchvision.models, args.model)(weights=None).eval().to(args.device)
    built = time.perf_counter()
    captured: dict[str, torch.Tensor] = {}
    calls: Counter[str] = Counter()

    def hook(name: str):  # a module called again (resnet's relu) gets name:1, name:2
        def keep(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
            key = name if not calls[name] else f"{name}:{calls[name]}"
            calls[name] += 1
            if isinstance(output, tuple):  # a transformer block: hidden states first
                output = output[0]
            if args.text:  # a row per token
                output = output.reshape(-1, output.shape[-1])
            captured[key] = output.detach().to("cpu", copy=True)

        return keep

    if not args.bare:
        for name, module in model.named_modules():
            leaf = next(iter(module.children()), None) is None
            chosen = any(fnmatchcase(name, glob) for glob in args.layers or [])
            if chosen if args.layers else leaf:
                module.register_forward_hook(hook(name))
        args.out.mkdir(parents=True, exist_ok=True)

    forward = save = 0.0
    total = args.num_samples or args.batch_size
    if args.text:
        windows = torch.tensor(pack(tokenizer, args.text, args.context_size, total))
        batches = [{"input_ids": ids} for ids in windows.split(args.batch_size)]
    else:
        generator = torch.Generator().manual_seed(0)
        sizes = [min(args.batch_size, total - s) for s in range(0, total, args.batch_size)]
        batches = [{"x": torch.randn(n, 3, 224, 224, generator=generator)} for n in sizes]
    for i, batch in enumerate(batches):
        batch = {name: value.to(args.device) for name, value in batch.items()}
        t = time.perf_counter()
        with torch.inference_mode():
            model(**batch) if args.text else model(batch["x"])
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        forward += time.perf_counter() - t
        if not args.bare:
            t = time.perf_counter()
            if args.text:
                captured["input_ids"] = batch["input_ids"].reshape(-1).cpu()
            save_file(captured, str(args.out / f"batch-{i:05d}.safetensors"))
            save += time.perf_counter() - t
        captured.clear()
        calls.clear()
    phases = {
        "import": imported - started,
        "build": built - imported,
        "forward": forward,
        "save": save,
        "in_process": time.perf_counter() - started,
    }
    print(json.dumps(phases), flush=True)


def pack(tokenizer: object, corpus: Path, context: int, samples: int) -> list[list[int]]:
    """Windows of `context` tokens: BOS, then the documents' tokens joined with EOS."""
    eos = bos = tokenizer.eos_token_id  # type: ignore[attr-defined]
    stream: list[int] = []
    windows: list[list[int]] = []
    with corpus.open() as lines:
        for line in lines:
            ids = tokenizer(line.rstrip("\n"), add_special_tokens=False)["input_ids"]  # type: ignore[operator]
            stream += [*ids, eos]
            while len(stream) >= context - 1 and len(windows) < samples:
                windows.append([bos, *stream[: context - 1]])
                del stream[: context - 1]
            if len(windows) == samples:
                break
    return windows


if __name__ == "__main__":
    main()
