"""The one way in for every input source: `open_feed` turns `InputOptions` into a `Feed`.

A new source (text, say) is a module of its own in `inputs/` and one branch here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hookdump.inputs.files import open_input
from hookdump.inputs.samples import Feed, InputOptions, SampleForm, random_batches, share_of


def open_feed(
    options: InputOptions,
    *,
    seed: int,
    form: Callable[[], SampleForm],
    transforms: Any = None,
    done: Sequence[Any] | None = None,
    share: tuple[int, int] | None = None,
) -> Feed:
    """The samples `options` name (`seed`: of random input). `form`: the model's input
    form, worked out only when a source needs it (random input, images); `transforms`: the
    weights' preprocessing;
    `done`: ids of the samples already dumped (resuming: the feed goes on after them);
    `share` (rank, world): a torchrun rank's slice of the samples."""
    done = done or []
    if options.source != "random":
        return open_input(options, form=form, transforms=transforms, done=done, share=share)
    total = options.num_samples if options.num_samples is not None else options.batch_size
    first, stop = share_of(total, share)

    def batches(batch_size: int) -> Any:
        return random_batches(form(), stop - first, batch_size, seed, len(done), first)

    return Feed("random", stop - first, range(first, stop), batches)
