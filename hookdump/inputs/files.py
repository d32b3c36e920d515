"""Reading inputs from files: images (decoded in DataLoader workers) and tensor files.

Both stream: images are read batch by batch, tensor files through memory maps, so a folder
of 100k images never sits in memory at once.
"""

from __future__ import annotations

import glob
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps

from hookdump.errors import HookdumpError, opt
from hookdump.inputs.samples import Batch, Feed, InputOptions, SampleForm, share_of

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
TENSOR_SUFFIXES = (".safetensors", ".pt", ".npy")
LIST_SUFFIXES = (".txt", ".lst", ".list", "")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_IMAGE_SIZE = 16384  # --image-size: a crop larger than this is a typo, not an image


def image_paths(text: str, stdin: Any = None) -> list[Path]:
    """The images `--input` names: a file, a folder, a glob, a list file, or `-` (stdin)."""
    path = Path(text)
    if text == "-":
        return _listed((stdin or sys.stdin).read().splitlines(), "standard input")
    if path.is_dir():
        found = sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        if not found:
            raise HookdumpError(
                f"{opt('input')} {text}: no images in this folder (looked for "
                f"{', '.join(IMAGE_SUFFIXES)})"
            )
        return found
    if path.is_file():
        if path.suffix.lower() in IMAGE_SUFFIXES:
            return [path]
        if path.suffix.lower() not in LIST_SUFFIXES:
            raise HookdumpError(
                f"{opt('input')} {text}: not an image ({', '.join(IMAGE_SUFFIXES)}), a tensor file "
                f"({', '.join(TENSOR_SUFFIXES)}) or a list of image paths "
                f"({', '.join(s for s in LIST_SUFFIXES if s)} or no suffix)"
            )
        try:
            lines = path.read_text().splitlines()
        except (UnicodeDecodeError, OSError) as exc:
            raise HookdumpError(
                f"{opt('input')} {text} is neither an image, a tensor file nor a text list of "
                "image "
                f"paths ({exc})"
            ) from None
        return _listed(lines, str(path))
    if any(c in text for c in "*?["):
        found = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
        if not found:
            raise HookdumpError(f"{opt('input')} {text!r}: the glob matches no file")
        return found
    raise HookdumpError(
        f"{opt('input')} {text}: no such file or folder; give random, an image, a folder, a glob, "
        "a list file, -, or a tensor file"
    )


def _listed(lines: list[str], source: str) -> list[Path]:
    paths = [Path(line.strip()) for line in lines if line.strip() and not line.startswith("#")]
    if not paths:
        raise HookdumpError(f"{opt('input')}: {source} lists no image paths")
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise HookdumpError(
            f"{opt('input')}: {source} lists {len(missing)} path(s) that are not files, first "
            f"{missing[0]} (relative paths are relative to the current folder)"
        )
    return paths


def open_rgb(path: Path) -> Image.Image:
    """Decode any image as 8-bit RGB: EXIF rotation applied, 16-bit and greyscale scaled."""
    with Image.open(path) as raw:
        image = ImageOps.exif_transpose(raw)
        if image.mode.startswith("I"):  # 16/32-bit integer greyscale, e.g. 16-bit PNG
            values = np.asarray(image, dtype=np.float64)
            top = 65535.0 if values.max(initial=0) > 255 else 255.0
            image = Image.fromarray((values / top * 255).round().astype(np.uint8), "L")
        elif image.mode == "F":
            values = np.asarray(image, dtype=np.float64).clip(0, 1)
            image = Image.fromarray((values * 255).round().astype(np.uint8), "L")
        return image.convert("RGB")


def image_transform(
    form: SampleForm, weights_transforms: Any, image_size: int | None
) -> Callable[[Image.Image], torch.Tensor]:
    """The weights' own preprocessing, else resize, centre crop and ImageNet normalisation."""
    import torchvision.transforms.functional as TF

    if form.layout == "detection":
        return TF.to_tensor  # detection models resize and normalise inside
    if form.layout != "image" or len(form.shape) != 3:
        raise HookdumpError(
            f"{opt('input')}: images need a model that takes [3, H, W] images; this one takes "
            f"{form.layout} input of shape {list(form.shape)} per sample (use random input "
            "or a tensor file)"
        )
    if weights_transforms is not None and image_size is None:
        return weights_transforms
    crop = image_size or form.shape[-1]
    resize = round(crop * 256 / 224)
    mean = getattr(weights_transforms, "mean", IMAGENET_MEAN)
    std = getattr(weights_transforms, "std", IMAGENET_STD)

    def transform(image: Image.Image) -> torch.Tensor:
        image = TF.center_crop(TF.resize(image, resize, antialias=True), [crop, crop])
        return TF.normalize(TF.to_tensor(image), list(mean), list(std))

    return transform


class _Images(torch.utils.data.Dataset):
    def __init__(self, paths: list[Path], transform: Callable[[Image.Image], torch.Tensor]):
        self.paths = paths
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, torch.Tensor | None, str | None]:
        try:
            return index, self.transform(open_rgb(self.paths[index])), None
        except Exception as exc:  # an untrusted file: any failure to decode it is its own
            message = " ".join(str(exc).split())[:200]
            return index, None, f"{type(exc).__name__}: {message}"


def _as_list(items: list[Any]) -> list[Any]:
    return items


def image_input(
    paths: list[Path],
    form: SampleForm,
    transform: Callable[[Image.Image], torch.Tensor],
    *,
    skip_bad: bool,
    workers: int,
    done: Sequence[str] | None = None,
    files: list[Path] | None = None,
) -> Feed:
    """Images decoded in `workers` processes; undecodable ones stop the run, or are skipped.

    `done`: the ids of samples already dumped (when resuming): reading goes on after the
    last of them. `files`: every image of the dump (all ranks'), for the resume check.
    """
    files = paths if files is None else files
    done = done or []
    if done:
        names = [str(p) for p in paths]
        if done[-1] not in names:
            raise HookdumpError(
                f"{opt('resume', True)}: the dump's last image {done[-1]} is no longer among the "
                "inputs; "
                f"make the dump again without {opt('resume', True)}"
            )
        paths = paths[names.index(done[-1]) + 1 :]
    ids: list[Any] = list(done)
    skipped: list[dict[str, str]] = []

    def batches(batch_size: int) -> Iterator[Batch]:
        loader = torch.utils.data.DataLoader(
            _Images(paths, transform),
            batch_size=batch_size,
            num_workers=workers if len(paths) > batch_size else 0,
            collate_fn=_as_list,
        )
        row = len(done)
        for items in loader:
            good = []
            for index, tensor, error in items:
                if error is None:
                    good.append((index, tensor))
                elif skip_bad:
                    skipped.append({"path": str(paths[index]), "error": error})
                else:
                    raise HookdumpError(
                        f"{opt('input')}: cannot decode {paths[index]} ({error}); remove it or "
                        "pass "
                        f"{opt('skip_bad_inputs', True)}"
                    )
            if not good:
                continue
            ids.extend(str(paths[i]) for i, _ in good)
            tensors = [t for _, t in good]
            args = (tensors,) if form.layout == "detection" else (torch.stack(tensors),)
            yield Batch(args, {}, row, row + len(good))
            row += len(good)

    return Feed(
        "images", len(done) + len(paths), ids, batches, source_skipped=skipped, files=list(files)
    )


def tensor_input(
    path: Path, limit: int | None, first: int = 0, share: tuple[int, int] | None = None
) -> Feed:
    """Rows of a tensor file: one tensor is the batch; several are keyword arguments.

    `share` (rank, world): only that rank's contiguous slice of the rows, numbered from 0."""
    columns = open_tensor_file(path)
    rows = {name: int(shape[0]) if shape else 0 for name, (shape, _) in columns.items()}
    counts = set(rows.values())
    if len(counts) != 1 or 0 in counts:
        raise HookdumpError(
            f"{opt('input')} {path}: every tensor needs the same number of rows in dim 0, found "
            f"{rows}"
        )
    total = counts.pop() if limit is None else min(limit, counts.pop())
    offset, end = share_of(total, share)
    total = end - offset

    def batches(batch_size: int) -> Iterator[Batch]:
        for start in range(first, total, batch_size):
            stop = min(start + batch_size, total)
            parts = {
                name: _float32(read(offset + start, offset + stop))
                for name, (_, read) in columns.items()
            }
            if len(parts) == 1:
                yield Batch((next(iter(parts.values())),), {}, start, stop)
            else:
                yield Batch((), parts, start, stop)

    ids = range(offset, offset + total)
    return Feed("tensors", total, ids, batches, files=[path])


ReadRows = Callable[[int, int], torch.Tensor]


def open_tensor_file(path: Path) -> dict[str, tuple[list[int], ReadRows]]:
    """name -> (shape, read rows start:stop), reading lazily where the format allows."""
    suffix = path.suffix
    try:
        if suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118

            def reader(key: str) -> ReadRows:
                def read(start: int, stop: int) -> torch.Tensor:
                    with safe_open(str(path), framework="pt") as f:
                        return f.get_slice(key)[start:stop]

                return read

            return {k: (shape, reader(k)) for k, shape in shapes.items()}
        if suffix == ".npy":
            array = np.load(path, mmap_mode="r", allow_pickle=False)
            if array.dtype.kind not in "biuf":
                raise HookdumpError(
                    f"{opt('input')} {path} holds {array.dtype} values; a model takes numbers: "
                    "save "
                    "a numeric (bool, int or float) array"
                )
            return {
                "input": (list(array.shape), lambda a, b: torch.from_numpy(np.array(array[a:b])))
            }
        from hookdump.model.weights import torch_load_safely

        content = torch_load_safely(path, opt("input"))
    except HookdumpError:
        raise
    except Exception as exc:
        raise HookdumpError(
            f"{opt('input')} {path} is not a readable {suffix} file: {exc}"
        ) from None
    if isinstance(content, torch.Tensor):
        content = {"input": content}
    if not (isinstance(content, dict) and all(torch.is_tensor(v) for v in content.values())):
        raise HookdumpError(
            f"{opt('input')} {path} holds a {type(content).__name__}; expected a tensor or a dict "
            "of "
            "tensors (keyword arguments)"
        )
    return {k: (list(v.shape), _rows_of(v)) for k, v in content.items()}


def _rows_of(tensor: torch.Tensor) -> Callable[[int, int], torch.Tensor]:
    return lambda start, stop: tensor[start:stop]


def _float32(tensor: torch.Tensor) -> torch.Tensor:
    # numpy's default float64 would not run through a float32 model
    return tensor.float() if tensor.dtype == torch.float64 else tensor


def open_input(
    options: InputOptions,
    *,
    form: Callable[[], SampleForm],
    transforms: Any,
    done: Sequence[Any],
    share: tuple[int, int] | None,
) -> Feed:
    """The file input that `options.source` names (anything but `random`); `form`: the
    model's input form, asked for only by images; `transforms`: the weights' preprocessing;
    `done`: ids of samples already in the dump being resumed; `share` (rank, world): a
    torchrun rank's slice."""
    text, limit = options.source, options.num_samples
    path = Path(text)
    if path.suffix in TENSOR_SUFFIXES:
        if not path.is_file():
            raise HookdumpError(f"{opt('input')} {text}: no such file")
        return tensor_input(path, limit, len(done), share)
    if path.suffix == ".parquet" or (path / "state.json").is_file():
        raise HookdumpError(
            f"{opt('input')} {text}: a table of token ids is read under {opt('per_token', True)} "
            "(its rows may differ in length: they make token rows, not samples of one shape)"
        )
    paths = image_paths(text)
    image_spec = form()
    transform = image_transform(image_spec, transforms, options.image_size)
    paths = paths[:limit] if limit else paths
    first, stop = share_of(len(paths), share)
    return image_input(
        paths[first:stop],
        image_spec,
        transform,
        skip_bad=options.skip_bad_inputs,
        workers=options.workers,
        done=done,
        files=paths,
    )
