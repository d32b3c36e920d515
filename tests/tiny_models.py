"""Tiny fixture models: each exercises one thing hand-written hooks get wrong.

Importable as `tiny_models:NAME` from this folder, so the CLI tests use them as MODEL specs.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import nn


class TwoLinear(nn.Module):
    """Linear(2,2) -> ReLU -> Linear(2,1) -> ReLU6, all weights and biases 1.

    For input 0.1 everywhere, by hand: linear_1 = 0.1 + 0.1 + 1 = 1.2 (both units),
    relu = 1.2, linear_2 = 1.2 + 1.2 + 1 = 3.4, relu6 = 3.4. The forward returns every
    intermediate, an independent reference for the captured values.
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(2, 2)
        self.relu = nn.ReLU()
        self.linear_2 = nn.Linear(2, 1)
        self.relu6 = nn.ReLU6()
        for p in self.parameters():
            nn.init.ones_(p)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h1 = self.linear_1(x)
        a1 = self.relu(h1)
        h2 = self.linear_2(a1)
        a2 = self.relu6(h2)
        return h1, a1, h2, a2


class SharedActivation(nn.Module):
    """One ReLU module called three times in a forward, as in resnet's Bottleneck."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        a = self.act(x)
        b = self.act(self.fc1(a) - 1.0)
        c = self.act(self.fc2(b) + x)
        return {"a": a, "b": b, "c": c}


class Pair(NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


@dataclass
class Output:
    logits: torch.Tensor
    hidden: tuple[torch.Tensor, ...]
    loss: torch.Tensor | None = None
    step: int = 0


class PairMaker(nn.Module):
    def forward(self, x: torch.Tensor) -> Pair:
        return Pair(x + 1, x * 2)


class Structured(nn.Module):
    """Modules returning a tuple, a dict, a named tuple and a dataclass with non-tensor leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 5, batch_first=True)  # (output, (h, c)): h, c have no batch dim 0
        self.pair = PairMaker()

    def forward(self, x: torch.Tensor) -> Output:
        seq, (h, _c) = self.lstm(x)
        pair = self.pair(seq)
        return Output(logits=pair.left.sum(-1), hidden=(pair.right, h), loss=None, step=3)


class KwargsModel(nn.Module):
    """A module taking a keyword argument, and an in-place ReLU that mutates its input."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = Scale()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.scale(x, factor=torch.full_like(x, -2.0)))


class Scale(nn.Module):
    def forward(self, x: torch.Tensor, *, factor: torch.Tensor) -> torch.Tensor:
        return x * factor


class FailsMidway(nn.Module):
    """Raises inside `broken`, after `first` and `second` have run."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.second = nn.ReLU()
        self.broken = Broken()
        self.never = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.never(self.broken(self.second(self.first(x))))


class Broken(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("shapes do not line up\nsecond line of the message")


class ConvNet(nn.Module):
    """A small conv net: Conv -> BatchNorm -> in-place ReLU, twice, then a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(inplace=True),
            nn.Conv2d(4, 4, 3, padding=1),
            nn.BatchNorm2d(4),
            nn.ReLU(inplace=True),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.features(x)).flatten(1))


def two_linear_factory(bias: float = 1.0, bias_2: float = 1.0) -> TwoLinear:
    """A factory with keyword arguments, for --model-arg: the biases of each Linear."""
    model = TwoLinear()
    nn.init.constant_(model.linear_1.bias, bias)
    nn.init.constant_(model.linear_2.bias, bias_2)
    return model


class Interrupts(nn.Module):
    """Acts as if the user pressed Ctrl-C during the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.fc(x)
        raise KeyboardInterrupt


def not_a_model() -> torch.Tensor:
    """A factory that returns something other than a module."""
    return torch.zeros(1)


class MakesNaN(nn.Module):
    """NaN appears in `log` (log of a negative number) and spreads to everything after it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 3)
        self.log = Log()
        self.fc2 = nn.Linear(3, 2)
        for p in self.parameters():
            nn.init.constant_(p, -1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.log(self.fc1(x.abs())))


class Log(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class TwoInputs(nn.Module):
    """A forward with two named tensor arguments, fed by a multi-tensor .safetensors file."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        for p in self.parameters():
            nn.init.ones_(p)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fc(a) * b


class Tripwire(nn.Module):
    """Counts its calls across all instances: proves whether the forward went this far."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Tripwire.calls += 1
        return x


class EarlyAndLate(nn.Module):
    """`early`, then `act` (also called again at the end), then a tripwire."""

    def __init__(self) -> None:
        super().__init__()
        self.early = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.middle = nn.Linear(4, 4)
        self.tripwire = Tripwire()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.middle(self.act(self.early(x)))
        return self.act(self.tripwire(h))


class Growing(nn.Module):
    """Each forward returns one more feature than the last: per-sample shapes change."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 8)
        self.grow = Grow()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.grow(self.fc(x))


class Grow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.width = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.width += 1
        return x[:, : self.width]


class _AtBatch(nn.Module):
    """TwoLinear that calls `at_batch(n)` in the forward of each batch of more than one
    sample (n counted from 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TwoLinear()
        self.batches = 0

    def at_batch(self, n: int) -> None:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if x.shape[0] > 1:
            self.batches += 1
            self.at_batch(self.batches)
        return self.inner(x)


class CtrlC(_AtBatch):
    """Acts as if Ctrl-C were pressed during the forward of batch N, N from
    $HOOKDUMP_TEST_CTRL_C_AT."""

    def at_batch(self, n: int) -> None:
        import os

        if str(n) == os.environ.get("HOOKDUMP_TEST_CTRL_C_AT"):
            raise KeyboardInterrupt


class Tokens(nn.Module):
    """A [batch, tokens, features] model with a 1-d conv giving [batch, channels, length]."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 6)
        self.conv = nn.Conv1d(6, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)  # [B, T, 6]
        return self.conv(h.transpose(1, 2))  # [B, 3, T]


class Barrier(_AtBatch):
    """The forward of batch N ($HOOKDUMP_TEST_BARRIER_AT) makes the file `ready` in the
    folder $HOOKDUMP_TEST_BARRIER, then waits until the test makes `go` there: a test acts on
    a run known to be mid-batch, however slowly the machine started it."""

    def at_batch(self, n: int) -> None:
        import os
        import time
        from pathlib import Path

        if str(n) == os.environ.get("HOOKDUMP_TEST_BARRIER_AT"):
            folder = Path(os.environ["HOOKDUMP_TEST_BARRIER"])
            (folder / "ready.tmp").write_text(str(os.getpid()))  # who waits: a test may kill it
            (folder / "ready.tmp").replace(folder / "ready")
            while not (folder / "go").exists():
                time.sleep(0.01)


class FillsDisk(_AtBatch):
    """The forward of batch N ($HOOKDUMP_TEST_FILL_AT) fills the disk holding the file
    $HOOKDUMP_TEST_FILL with it, all but $HOOKDUMP_TEST_FILL_LEAVE bytes."""

    def at_batch(self, n: int) -> None:
        import os

        if str(n) != os.environ.get("HOOKDUMP_TEST_FILL_AT"):
            return
        fd = os.open(os.environ["HOOKDUMP_TEST_FILL"], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            while True:
                os.write(fd, bytes(4096))
        except OSError:  # full
            leave = int(os.environ.get("HOOKDUMP_TEST_FILL_LEAVE", "0"))
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
        finally:
            os.close(fd)


class _TwoOutputs(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1, x * 2


class KeyClash(nn.Module):
    """A child `x` called twice (keys `x`, `x@1`) beside a child named `x@1`, and a child `t`
    returning a tuple (`t:output.0`) beside a module named `t:output.0`."""

    def __init__(self) -> None:
        super().__init__()
        self.x = nn.Linear(2, 2)
        self.add_module("x@1", nn.Linear(2, 2))
        self.t = _TwoOutputs()
        self.add_module("t:output", nn.Sequential(nn.Identity()))  # its child: t:output.0

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        a = getattr(self, "x@1")(self.x(self.x(a)))
        return getattr(self, "t:output")(self.t(a)[0])


class NoGuess(nn.Module):
    """No Linear, Conv or Embedding to guess a random input from: it takes whatever it is fed."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x * 2)


class NoGuessPair(nn.Module):
    """NoGuess with two keyword inputs and a structured output."""

    def __init__(self) -> None:
        super().__init__()
        self.pair = PairMaker()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Pair:
        return self.pair(a - b)


def no_guess_factory(scale: float = 1.0) -> NoGuess:
    """A --model-arg factory for a model with nothing to guess an input from."""
    model = NoGuess()
    model.scale = scale
    return model


class NotesGC(nn.Module):
    """Linear(2, 2) that notes whether Python's garbage collector was on when it was built
    and at each forward (`hookdump run` pauses it while torch and the model load)."""

    seen: ClassVar[list[bool]] = []

    def __init__(self) -> None:
        super().__init__()
        NotesGC.seen = [gc.isenabled()]
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        NotesGC.seen.append(gc.isenabled())
        return self.fc(x)


HOSTILE = "\x1b]0;pwned\x07\u202e\x9b31m\x7f"  # OSC title, bidi override, C1 CSI, DEL


class HostileNames(nn.Module):
    """A child whose name and class name hold terminal control characters."""

    def __init__(self) -> None:
        super().__init__()
        child = nn.Linear(2, 2)
        child._hookdump_type = f"Linear{HOSTILE}"  # as an export's class names
        self.add_module(f"a{HOSTILE}", child)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, f"a{HOSTILE}")(x)


class OpsBlock(nn.Module):
    """Ops of its own forward around a child: `x + 1`, the child `proj` (whose own ops are
    its, not the block's), `softmax`, `a @ b`, a view, and `+=` twice. The forward returns
    every intermediate, the reference for `--capture ops`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shifted = x + 1  # add
        projected = self.proj(shifted)  # the child's linear: not the block's op
        weights = torch.softmax(projected, dim=-1)  # softmax
        mixed = weights * shifted  # mul
        flat = mixed.view(-1)  # a view: not an op result of its own
        total = mixed.clone()  # clone
        total += x  # add_
        after_first = total.clone()  # clone@1
        total += 1  # add_@1
        return shifted, projected, weights, mixed, flat, after_first, total
