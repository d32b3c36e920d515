"""The loop hookdump replaces, as a user writes it: forward hooks that clone what the
modules return, then `safetensors.torch.save_file` once per batch. With `--bare`, the
forward passes alone (no hooks, nothing saved): a piece of the physical limit.

    python benchmarks/handwritten.py OUT --batch-size 16 --num-samples 64 [--layers 'layer1.*']

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
    parser.add_argument("--layers", help="a glob over module names; default: every leaf")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--num-samples", type=int)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bare", action="store_true", help="forward passes only")
    args = parser.parse_args()
    imported = time.perf_counter()

    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None).eval().to(args.device)
    built = time.perf_counter()

    captured: dict[str, torch.Tensor] = {}
    calls: Counter[str] = Counter()

    def hook(name: str):  # a module called again (resnet's relu) gets name:1, name:2
        def keep(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
            key = name if not calls[name] else f"{name}:{calls[name]}"
            calls[name] += 1
            captured[key] = output.detach().to("cpu", copy=True)

        return keep

    if not args.bare:
        for name, module in model.named_modules():
            leaf = next(iter(module.children()), None) is None
            if fnmatchcase(name, args.layers) if args.layers else leaf:
                module.register_forward_hook(hook(name))
        args.out.mkdir(parents=True, exist_ok=True)

    forward = save = 0.0
    total = args.num_samples or args.batch_size
    generator = torch.Generator().manual_seed(0)
    for i, start in enumerate(range(0, total, args.batch_size)):
        x = torch.randn(min(args.batch_size, total - start), 3, 224, 224, generator=generator)
        x = x.to(args.device)
        t = time.perf_counter()
        with torch.inference_mode():
            model(x)
        if x.is_cuda:
            torch.cuda.synchronize()
        forward += time.perf_counter() - t
        if not args.bare:
            t = time.perf_counter()
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


if __name__ == "__main__":
    main()
