"""The batch loop: each batch through the hooked model, its values to the sink thread.

It knows nothing of resuming or ranks (the destination made the writer for that), nor of
how the run was assembled (`engine.runner`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from hookdump.engine.destination import Destination
from hookdump.engine.generate import Generated, Generator
from hookdump.engine.progress import ProgressCallback
from hookdump.engine.signals import exit_code
from hookdump.errors import HookdumpError, Interrupted
from hookdump.format.keys import KeyInfo
from hookdump.format.rows import Rows, SampleIds
from hookdump.hooks.capture import Hooks
from hookdump.hooks.forward import calibrate, ends_late, forward, one_line, out_of_memory
from hookdump.hooks.gradients import backward, inputs_requiring_grad
from hookdump.hooks.tokens import TokenRows
from hookdump.inputs.samples import Batch, Feed
from hookdump.model.loading import LoadedModel
from hookdump.store.write.sink import BatchSink


@dataclass
class Fed:
    """What the batches fed so far carried (after those a resumed dump holds): their
    samples' ids, and the inputs skipped before them."""

    ids: SampleIds = field(default_factory=SampleIds)
    skipped: list[dict[str, str]] = field(default_factory=list)
    generated: list[list[Any]] = field(default_factory=list)  # --generate: per sample


@dataclass(frozen=True)
class ForwardOptions:
    """How each forward runs: its precision (autocast below float32), the objective of
    gradients, whether it ends once the selection has run, and the MODEL spec, for errors."""

    dtype: torch.dtype
    grad_target: str | int
    early_stop: bool
    label: str


class BatchLoop:
    """Feeds batches through the hooked model; the values go to the writer thread. It knows
    nothing of resuming or ranks: the destination made the writer for that."""

    def __init__(
        self,
        cap: Hooks,
        loaded: LoadedModel,
        sink: BatchSink,
        how: ForwardOptions,
        tokens: TokenRows | None = None,
        generator: Generator | None = None,
    ) -> None:
        self.cap, self.model, self.sink, self.tokens = cap, loaded.module, sink, tokens
        self.generator = generator  # --generate: makes each batch's sequences
        self.fed = Fed()
        self.device, self.how = loaded.device, how
        self.grads = "grad" in cap.kinds
        # early stop ends a forward under the hooks: never one that generates (decode)
        decodes = generator is not None and generator.decodes
        self.early = how.early_stop and not self.grads and not decodes
        # the selection ends the forward (nearly): count the calls in the first batch itself
        self.count_in_first = self.early and ends_late(cap, self.model)

    @property
    def sequences(self) -> int:
        """Samples fed (rows count them, or tokens with `tokens`)."""
        return len(self.fed.ids)

    def run(
        self,
        batches: Iterator[Batch],
        destination: Destination,
        feed: Feed,
        on_batch: ProgressCallback | None,
        nothing: Callable[[], HookdumpError] | None = None,
    ) -> int:
        """Feed every batch (of `feed`); the number of rows dumped (this run's last row,
        resuming); `nothing`: the error to raise, before anything is written, when no row
        was made."""
        rows = destination.done_rows
        self.fed = Fed(SampleIds(destination.done_ids), [], list(destination.done_generated))
        # gradients need autograd; everything else runs without it
        mode = torch.enable_grad() if self.grads else torch.inference_mode()
        try:
            with self.cap, mode, _autocast(self.device, self.how.dtype):
                for batch in batches:
                    # what the manifest records of these samples, carried by the batch
                    done = self._one(batch, rows)
                    rows = done.stop
                    self.fed.ids.extend(batch.ids)
                    self.fed.generated.extend(list(g) for g in done.generated)
                    self.fed.skipped.extend(batch.skipped)
                    if on_batch:
                        on_batch(self.sequences, feed.total, self.sink.bytes_done)
            # inputs skipped after the last batch: no batch carries them
            self.fed.skipped.extend(feed.source_skipped[len(self.fed.skipped) :])
            if rows == 0 and nothing is not None:
                raise nothing()
            self.sink.close()
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: a second one is ignored
            self.sink.abort()
            raise Interrupted(destination.interrupted(), exit_code(exc)) from None
        except BaseException:
            self.sink.abort()
            raise
        return rows

    def _one(self, batch: Batch, first_row: int) -> Rows:
        """One batch, its rows from `first_row` on (with the ids, skipped inputs and, with
        `--generate`, the sequences' stops it carries)."""
        cap = self.cap
        generated = self._generate(batch)  # prefill: the hooks are off while it generates
        if generated is not None:
            batch = generated.batch
        if self.early and cap.stop_after is None and not self.count_in_first:
            self.early = calibrate(cap, self.model, batch, self.how.label)
        cap.next_batch(batch.kwargs.get("attention_mask") if batch.stored else None)
        stored = batch.stored
        fed = (batch.ids, batch.skipped, generated.sequences.record() if generated else ())
        rows = Rows(first_row, batch.stop, batch.start, batch.stop, False, *fed)
        if self.tokens is not None:  # rows are the batch's selected tokens
            count, stored = self.tokens.rows(batch)
            rows = Rows(first_row, first_row + count, batch.start, batch.stop, True, *fed)
        self.sink.begin(rows, cap.keys_expected + list(stored))
        for key, tensor in stored.items():  # the input itself: token ids, the mask
            shape, first = tuple(tensor.shape[1:]), tensor.shape[0]
            info = KeyInfo(key, key, "-", "tokens", 0, None, shape, tensor.dtype, first)
            self.sink.keep(key, tensor, info, fresh=True)
        inputs = inputs_requiring_grad(batch.args, batch.kwargs) if self.grads else []
        if generated is not None and self.generator is not None and self.generator.decodes:
            self.generator.flush(generated)  # the passes that generated, joined
            output = None
        else:
            output = forward(cap, self.model, batch, self.how.label)
        if self.grads:
            backward(self.model, output, self.how.grad_target, inputs)
        del output
        if first_row == 0:  # the first forward: what it asked for was there
            cap.check_ops()
            if self.tokens is not None:
                self.tokens.check_modules()
        if self.early and cap.stop_after is None:  # the first batch ran whole, counted
            cap.stop_early(dict(cap.calls))
        cap.clear()
        self.sink.end()
        return rows

    def _generate(self, prompts: Batch) -> Generated | None:
        """With `--generate`: the batch's sequences made; else None."""
        if self.generator is None:
            return None
        try:
            generated = self.generator.run(prompts)
        except (KeyboardInterrupt, HookdumpError):
            raise
        except Exception as exc:
            if out_of_memory(exc):
                raise
            raise HookdumpError(
                f"generating with {self.how.label} raised {type(exc).__name__}: {one_line(exc)}"
            ) from exc
        return generated


def _autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
