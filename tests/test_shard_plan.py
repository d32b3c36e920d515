"""`ShardPlan`'s decisions on their own: when batches stream into shards of their own, how
many rows a planned shard gets, and when a batch no longer fits the shard planned."""

from __future__ import annotations

from hookdump.store.write.plan import ShardPlan

MIB = 1 << 20


def test_batches_stream_while_each_is_at_least_half_a_shard() -> None:
    plan = ShardPlan(shard_bytes=100 * MIB, total=1000)
    assert plan.streams
    plan.streamed(rows=10, nbytes=50 * MIB)  # exactly half: still a shard each
    assert plan.streams
    plan.streamed(rows=10, nbytes=120 * MIB)
    assert plan.streams


def test_small_batches_are_gathered_into_shards_of_whole_batches() -> None:
    plan = ShardPlan(shard_bytes=100 * MIB, total=1000)
    plan.streamed(rows=8, nbytes=30 * MIB)  # three such batches fit in 100 MiB
    assert not plan.streams
    assert plan.rows_per_shard == 24
    tiny = ShardPlan(shard_bytes=100 * MIB)
    tiny.streamed(rows=4, nbytes=0)  # an empty batch's bytes: no division by zero
    assert tiny.rows_per_shard == 4 * 100 * MIB


def test_a_planned_shard_is_never_larger_than_the_rows_left() -> None:
    plan = ShardPlan(shard_bytes=100 * MIB, total=100)
    plan.streamed(rows=8, nbytes=10 * MIB)  # 80 rows a shard
    assert plan.planned_rows(start=8, stop=16, last_sample=16) == 80
    assert plan.planned_rows(start=88, stop=96, last_sample=96) == 12  # the last 12 rows
    assert plan.planned_rows(start=96, stop=104, last_sample=104) == 8  # at least the batch


def test_token_rows_are_planned_from_the_samples_still_expected() -> None:
    """Rows are tokens: 10 samples of 6 rows each are expected; the first batch (2
    samples) gave 12 rows, so from sample 4 on, 6 samples are left: 36 rows, plus the
    batch's own."""
    plan = ShardPlan(shard_bytes=100 * MIB, expected=lambda: 10)
    assert plan.rows_left(start=12, stop=24, last_sample=4) is None  # nothing seen yet
    plan.first_batch(rows=12, samples=(0, 2))
    plan.streamed(rows=12, nbytes=MIB)
    assert plan.rows_left(start=12, stop=24, last_sample=4) == 12 + 36
    assert plan.planned_rows(start=12, stop=24, last_sample=4) == 48
    unknown = ShardPlan(shard_bytes=100 * MIB, expected=lambda: None)
    unknown.first_batch(rows=12, samples=(0, 2))
    unknown.streamed(rows=12, nbytes=MIB)
    assert unknown.planned_rows(start=12, stop=24, last_sample=4) == 1200  # about a shard


def test_a_batch_that_would_overflow_the_planned_shard_does_not_fit() -> None:
    plan = ShardPlan(shard_bytes=100 * MIB)
    assert plan.fits(planned_start=0, planned_rows=30, start=20, stop=30)
    assert not plan.fits(planned_start=0, planned_rows=30, start=20, stop=31)
