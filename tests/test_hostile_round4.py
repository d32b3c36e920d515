"""Round 4 of hostile testing (issue 44, part 3): each finding, by its mechanism. The
flipped byte is in test_checksums.py, the Ray findings in test_ray.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import hookdump


class _Fixed(nn.Module):
    """A model whose output is its input, through a module to hook."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(x)


def test_a_feature_with_no_finite_value_has_no_mean_min_or_max(tmp_path: Path) -> None:
    torch.manual_seed(0)
    batches = [torch.randn(4, 3) for _ in range(3)]
    for batch in batches:
        batch[:, 1] = torch.nan  # feature 1 never finite
    hookdump.dump(_Fixed(), batches, tmp_path / "d", layers=["out"])
    stats = hookdump.load(tmp_path / "d").stats("out")
    assert stats["count"].tolist() == [12, 0, 12]
    for field in ("mean", "var", "std", "min", "max"):
        assert math.isnan(float(stats[field][1])), field
    every = torch.cat(batches).double()
    for feature in (0, 2):
        assert float(stats["mean"][feature]) == pytest.approx(float(every[:, feature].mean()))
        assert float(stats["min"][feature]) == float(every[:, feature].min())


@pytest.mark.parametrize("masked", [False, True], ids=["finite", "with_a_nan"])
def test_norms_near_float32_largest_do_not_overflow(tmp_path: Path, masked: bool) -> None:
    """Rows of 3e38 (float32's largest is 3.4e38): their squares overflow float32, the norms
    (8.5e38) do not fit it either; the mean norm is float64, and SAELens' scaling factor
    sqrt(d) / norm_mean is not 0."""
    batch = torch.full((4, 8), 3e38)
    if masked:
        batch[0, 0] = torch.nan  # the masked way: that row has no norm
    hookdump.dump(_Fixed(), [batch], tmp_path / "d", layers=["out"])
    stats = hookdump.load(tmp_path / "d").stats("out")
    want = math.sqrt(8) * 3e38  # by hand: each row is 8 values of 3e38
    assert float(stats["norm_mean"]) == pytest.approx(want, rel=1e-6)
    assert int(stats["rows"]) == (3 if masked else 4)
    assert math.sqrt(8) / float(stats["norm_mean"]) > 0
    assert float(stats["var"][1]) == pytest.approx(0.0, abs=1e30)  # no inf from the squares
    assert math.isfinite(float(stats["var"][1]))


def test_a_key_that_is_not_a_str_is_a_clear_type_error(tmp_path: Path) -> None:
    hookdump.dump(_Fixed(), [torch.randn(2, 3)], tmp_path / "d", layers=["out"])
    dump = hookdump.load(tmp_path / "d")
    for call in (dump.stats, dump.__getitem__, dump.info):
        with pytest.raises(
            TypeError, match=r"a key of .* is its name, a str such as 'out', not int"
        ):
            call(3)  # type: ignore[arg-type]


PLANTED = "PLANTED-SECRET-3c81d7"


def test_a_secret_nested_in_storage_options_is_never_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`client_kwargs={"endpoint_url": ...}`: values at every depth are blanked in error
    lines (the endpoint, on port 1 of the loopback, refuses at once)."""
    pytest.importorskip("s3fs")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:1/{PLANTED}"}}
    with pytest.raises(hookdump.HookdumpError) as raised:
        hookdump.dump(_Fixed(), [torch.rand(2, 3)], "s3://bucket/p", layers=["out"],
                      storage_options=options)  # fmt: skip
    line = str(raised.value)
    assert "cannot lock s3://bucket/p" in line and "Could not connect" in line
    assert PLANTED not in line and "\n" not in line


def test_credentials_in_a_bucket_url_are_one_line_saying_where_they_go(
    in_tests_dir: Path,
) -> None:
    from clitools import assert_usage_error, invoke

    url = f"s3://someuser:{PLANTED}@bucket/p"
    result = invoke("run", "tiny_models:TwoLinear", "-n", "2", "-o", url)
    line = assert_usage_error(result, "credentials in a s3:// URL", "--storage-option key=")
    assert PLANTED not in result.stdout + result.stderr and "someuser" not in line


def test_a_storage_error_of_several_lines_is_one_line_with_all_of_them() -> None:
    from hookdump.store.location import Remote

    remote = Remote("memory://bucket/p", {"key": PLANTED})
    error = ValueError(f"Parameter validation failed:\nInvalid bucket name {PLANTED!r}: ...")
    assert remote.reason(error) == "Parameter validation failed: Invalid bucket name '***': ..."


def test_a_lock_object_with_numbers_out_of_range_is_a_damaged_lock(
    bucket: str, in_tests_dir: Path
) -> None:
    """`run --overwrite` takes over a lock no run could have written (one line, never an
    OverflowError), and refuses it without `--overwrite` in one line."""
    import fsspec
    from clitools import assert_usage_error, invoke

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    fields = '"run_id": "r1", "host": "elsewhere"'
    for n, numbers in enumerate(
        [
            '"pid": 1e400, "started": 1.0, "beat": 1.0',  # read as infinity: int() overflows
            '"pid": 12, "started": 1e308, "beat": 1.0',  # time.gmtime() overflows
            '"pid": 12, "started": 1.0, "beat": -5.0',
            '"pid": 0, "started": 1.0, "beat": 1.0',
        ]
    ):
        fs.pipe_file(f"{bucket[5:]}/d{n}/hookdump.lock", f"{{{fields}, {numbers}}}".encode())
        run = ["run", "tiny_models:TwoLinear", "-n", "2", "-q", "-o", f"{bucket}/d{n}"]
        assert_usage_error(invoke(*run), "a run whose lock cannot be read", "--overwrite")
        result = invoke(*run, "--overwrite")
        assert result.exit_code == 0, (numbers, result.stderr)
        assert not fs.exists(f"{bucket[5:]}/d{n}/hookdump.lock")


def _lock_from_elsewhere(bucket: str, name: str, beat: float) -> None:
    import json

    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    lock = {"run_id": "r1", "host": "elsewhere", "pid": 12, "started": 1.0, "beat": beat}
    fs.pipe_file(f"{bucket[5:]}/{name}/hookdump.lock", json.dumps(lock).encode())


def test_a_lock_whose_time_lies_ahead_is_judged_by_what_this_run_sees(
    bucket: str, in_tests_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another host's clock a day ahead: its lock's last rewrite lies in the future, so its
    time tells nothing. Not rewritten while watched: taken over by `--overwrite`; rewritten
    while watched (here as the watcher reads it the second time): refused."""
    import time

    from clitools import assert_usage_error, invoke

    from hookdump.store.write import url_lock

    monkeypatch.setattr(url_lock, "LOCK_BEAT", 0.2)  # watched for 2.5 beats: 0.5 s
    ahead = time.time() + 86400
    _lock_from_elsewhere(bucket, "dead", ahead)
    run = ["run", "tiny_models:TwoLinear", "-n", "2", "-q", "-o"]
    line = assert_usage_error(invoke(*run, f"{bucket}/dead"), "is being written by run r1")
    assert "on elsewhere" in line
    result = invoke(*run, f"{bucket}/dead", "--overwrite")
    assert result.exit_code == 0, result.stderr

    _lock_from_elsewhere(bucket, "live", ahead)
    real_read, reads = url_lock.UrlLock._read, []

    def read_as_it_beats(self: url_lock.UrlLock) -> url_lock.Holder | None:
        reads.append(1)
        if len(reads) == 2:  # the holder rewrites its lock while it is watched
            _lock_from_elsewhere(bucket, "live", ahead + 60)
        return real_read(self)

    monkeypatch.setattr(url_lock.UrlLock, "_read", read_as_it_beats)
    assert_usage_error(invoke(*run, f"{bucket}/live", "--overwrite"), "is being written by")
    assert len(reads) == 2
