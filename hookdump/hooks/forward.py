"""One forward pass under the hooks: a model's own failure becomes an error that says where it
happened, and early stop is calibrated on one sample (or counted in the first batch)."""

from __future__ import annotations

from typing import Any

import torch

from hookdump.errors import HookdumpError, opt
from hookdump.hooks.calls import StopForward
from hookdump.hooks.capture import Hooks
from hookdump.inputs.samples import Batch


def forward(cap: Hooks, module: torch.nn.Module, batch: Batch, label: str) -> Any:
    """Run `module` on `batch` under `cap`'s hooks; None when early stop ended it.

    A model's own exception becomes a HookdumpError naming the module it was raised in and
    the hooked modules that had run (the original stays as its `__cause__`); an allocation
    failure is left as it is, for the caller to advise on."""
    try:
        return batch.call(module)
    except StopForward:
        return None
    except (KeyboardInterrupt, HookdumpError):
        raise
    except Exception as exc:
        if out_of_memory(exc):
            raise
        message = one_line(exc)
        inside = f"inside {cap.running[-1]!r}; " if cap.running else ""
        done = cap.finished
        ran = (
            f"hooked modules that had run: {len(done)} (last: {', '.join(done[-3:])})"
            if done
            else "no hooked module had run"
        )
        raise HookdumpError(
            f"the forward pass of {label} raised {type(exc).__name__}: {message} "
            f"({inside}{ran}); {_advice(batch)}"
        ) from exc


def one_line(exc: BaseException) -> str:
    """A model's own exception's message on one line, at most 300 characters of it."""
    message = " ".join(str(exc).split()) or "(no message)"
    return message if len(message) <= 300 else message[:300] + "..."


def _advice(batch: Batch) -> str:
    """What to check after a forward that raised, for the input it was given."""
    if batch.forward is not None:
        return f"check {opt('forward')} and the batch it was given"
    if len(batch.args) > 1:  # only a Python caller's tuple or list is called as model(*b)
        return (
            f"each batch is a tuple or list of {len(batch.args)}, called as model(*batch); "
            f"for (input, label) pairs give {opt('forward')}=lambda m, b: m(b[0])"
        )
    if "input_ids" in batch.kwargs:  # text or token ids: no --input-shape to blame
        return f"check the model's config.json and {opt('model_args')}"
    return f"check {opt('input_shape')} and {opt('model_args')}"


LATE = 0.1  # a selection followed by less than this share of the parameters ends late


def ends_late(cap: Hooks, module: torch.nn.Module) -> bool:
    """Whether the selected modules come last, followed (in registration order, a proxy for
    the order they run in) by less than LATE of the model's parameters. Early stop would
    then save little: the first batch runs whole and its calls are counted there, instead
    of in a forward of one sample of its own, which would cost more than it saves. Either
    way the counts are the model's own, so a wrong guess costs time only."""
    modules = list(module.named_modules())
    chosen = [i for i, (name, _) in enumerate(modules) if name in cap.modules]
    if not chosen:
        return False
    last = modules[chosen[-1]][0]
    after = sum(
        p.numel()
        for name, m in modules[chosen[-1] + 1 :]
        if not name.startswith(f"{last}.")  # its own parts run inside it
        for p in m.parameters(recurse=False)
    )
    total = sum(p.numel() for p in module.parameters())
    return total > 0 and after < LATE * total


def calibrate(cap: Hooks, module: torch.nn.Module, batch: Batch, label: str) -> bool:
    """Count each selected module's calls in a forward of one sample, and stop every later
    forward once they are all made (early stop).

    False when the model cannot take one sample (an export with a fixed batch size, say):
    then every forward runs whole."""
    try:
        with cap.counting_only():
            forward(cap, module, batch.first_row(), label)
    except HookdumpError:
        cap.clear()
        return False
    cap.stop_early(dict(cap.calls))
    return True


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (on the CPU or the GPU)."""
    if isinstance(exc, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text
    )
