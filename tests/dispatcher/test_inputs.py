"""dispatcher/inputs.py: the one set of bounds every face (explain, /routing/explain, bench, sweep) uses."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from dispatcher.inputs import (
    COMPUTE_DTYPES, FP8_DTYPES, MAX_REQUESTS, MAX_ROWS, MAX_TENSOR_ROWS, InputError, Rows, Threshold, check_arch,
    check_dtype, check_rows, check_threshold, check_topk, parse_query_lens, parse_rows_list,
)
from dispatcher.platform import KNOWN_ARCHS


@pytest.mark.parametrize("value", [0, -1, MAX_ROWS + 1, 10**30])
def test_rows_outside_the_bounds_are_refused_with_the_value(value):
    with pytest.raises(InputError, match=f"between 1 and {MAX_ROWS}; got {value}"):
        check_rows(value)


@pytest.mark.parametrize("value", [True, 1.5, "8", None])
def test_rows_must_be_an_integer(value):
    with pytest.raises(InputError, match="must be an integer"):
        check_rows(value)


def test_the_bounds_themselves_pass():
    assert check_rows(1) == 1 and check_rows(MAX_ROWS) == MAX_ROWS
    assert check_threshold(0) == 0 and check_topk(2**20) == 2**20
    with pytest.raises(InputError):
        check_topk(2**20 + 1)


@pytest.mark.parametrize("arch", KNOWN_ARCHS)
def test_every_known_arch_passes_in_any_case(arch):
    assert check_arch(f" {arch.upper()} ") == arch


@pytest.mark.parametrize("arch", ["foo", "gfx9999", "sm91"])
def test_an_unknown_arch_needs_the_flag(arch):
    with pytest.raises(InputError, match="--allow-unknown-arch"):
        check_arch(arch)
    assert check_arch(arch, allow_unknown=True) == arch


@pytest.mark.parametrize("arch", ["", "gfx 942", "gfx942;rm", "x" * 33])
def test_a_malformed_arch_is_refused_even_with_the_flag(arch):
    with pytest.raises(InputError, match="must look like"):
        check_arch(arch, allow_unknown=True)


def test_dtypes():
    assert check_dtype("torch.bfloat16") == "bfloat16"
    assert [check_dtype(d) for d in FP8_DTYPES] == list(FP8_DTYPES) and len(FP8_DTYPES) == 4
    with pytest.raises(InputError, match="--dtype must be one of bfloat16, float16, float32; got 'float8_e4m3fn'"):
        check_dtype("float8_e4m3fn", COMPUTE_DTYPES, "--dtype")


def test_rows_lists_sorted_without_duplicates_and_capped_where_tensors_are_made():
    assert parse_rows_list(" 16,1,2,16 ") == (1, 2, 16)
    with pytest.raises(InputError, match=r"^--rows values must be between 1 and 1048576; got 0$"):
        parse_rows_list("0", "--rows", maximum=MAX_TENSOR_ROWS)
    with pytest.raises(InputError, match="^--rows takes comma-separated integers; 'x' is not one$"):
        parse_rows_list("2,x", "--rows")
    with pytest.raises(InputError, match="at least one value"):
        parse_rows_list(" , ", "--rows")


def test_query_lens():
    assert parse_query_lens("1, 1,8000") == [1, 1, 8000]
    assert parse_query_lens(" ") is None
    with pytest.raises(InputError, match="entries must be between 1"):
        parse_query_lens([1, 0])
    with pytest.raises(InputError, match=r"rows \(the sum of query_lens\) must be between 1 and"):
        parse_query_lens([MAX_ROWS, 1])
    with pytest.raises(InputError, match="more than"):
        parse_query_lens([1] * (MAX_REQUESTS + 1))


def test_the_pydantic_types_run_the_same_checks():
    class M(BaseModel):
        rows: Rows
        gate: Threshold = 0

    assert M(rows=MAX_ROWS).rows == MAX_ROWS
    with pytest.raises(ValidationError) as err:
        M(rows=0)
    assert err.value.errors()[0]["msg"] == "Value error, must be between 1 and 2147483647; got 0"
    with pytest.raises(ValidationError):
        M(rows=1, gate=-1)
    schema = M.model_json_schema()["properties"]["rows"]
    assert (schema["minimum"], schema["maximum"]) == (1, MAX_ROWS)
