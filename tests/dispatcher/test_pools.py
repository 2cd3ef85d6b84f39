"""dispatcher.pools: the kv pool's bucket (bounded powers of two of bytes), and sizes as people write them."""

from __future__ import annotations

import pytest
import torch

from dispatcher.pools import MAX_BUCKET, MIN_BUCKET, format_bytes, parse_bytes, pool_bucket
from dispatcher.validate import validate


@pytest.mark.parametrize("nbytes, bucket", [
    (0, 0), (1, MIN_BUCKET), (MIN_BUCKET - 1, MIN_BUCKET), (8 << 20, 8 << 20), ((8 << 20) + 1, 8 << 20),
    ((16 << 20) - 1, 8 << 20), (3 << 30, 2 << 30), (5 << 40, MAX_BUCKET),
])
def test_a_pool_falls_in_the_power_of_two_at_or_below_it(nbytes, bucket):
    assert pool_bucket(nbytes) == bucket


def test_at_most_21_label_values():
    values = {pool_bucket(1 << i) for i in range(0, 48)} | {pool_bucket((1 << i) + 12345) for i in range(0, 48)}
    assert len(values) == 21 and min(values) == 1 << 20 and max(values) == 1 << 40


@pytest.mark.parametrize("text, nbytes", [("8MiB", 8 << 20), ("256 MiB", 256 << 20), ("4GiB", 4 << 30),
                                          ("1048576", 1 << 20), ("1.5k", 1536), ("2T", 2 << 40)])
def test_sizes_parse(text, nbytes):
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize("text", ["", "8 MB/s", "-1", "0", "0.5", "1.0001KiB", "lots"])
def test_bad_sizes_are_refused_naming_them(text):
    with pytest.raises(ValueError, match="not a"):
        parse_bytes(text)


def test_sizes_print_as_people_read_them():
    assert [format_bytes(n) for n in (8 << 20, 4 << 30, 1536, 100, 7281 * 1152)] == [
        "8 MiB", "4 GiB", "1.5 KiB", "100 B", "8 MiB"]


def test_a_validated_call_knows_its_pool_bucket():
    q, out = torch.zeros(2, 2, 64, dtype=torch.bfloat16), torch.zeros(2, 2, 48, dtype=torch.bfloat16)
    idx = torch.zeros(2, 4, dtype=torch.int32)
    for slots, bucket in ((8, 1 << 20), (1 << 16, 8 << 20), (100_000, 8 << 20)):  # 64 lanes x 2 bytes a slot
        kv = torch.zeros(slots, 1, 64, dtype=torch.bfloat16)
        assert validate(q, kv, idx, None, 0.125, 64, 48, 16, None, out).kv_pool_bytes == bucket
