"""/routing/explain's row bound is int32's max: row offsets (``cu_seqlens``, int32) must hold the sum of the rows."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from service.models import MAX_ROWS, ExplainQuery

INT32_MAX = torch.iinfo(torch.int32).max


def test_the_bound_is_int32s_max():
    assert MAX_ROWS == INT32_MAX == 2**31 - 1
    assert int(torch.tensor([0, MAX_ROWS], dtype=torch.int32)[-1]) == MAX_ROWS  # the last row offset fits


@pytest.mark.parametrize("field", ["rows", "gfx942_min_rows", "gfx950_min_rows"])
def test_at_the_edge(field):
    base = {"rows": 8} if field != "rows" else {}
    ExplainQuery(**base, **{field: 2**31 - 1})
    with pytest.raises(ValidationError, match=field):
        ExplainQuery(**base, **{field: 2**31})


def test_query_lens_sum_at_the_edge():
    assert ExplainQuery(query_lens=[2**31 - 2, 1]).rows == 2**31 - 1
    with pytest.raises(ValidationError, match="rows"):
        ExplainQuery(query_lens=[2**31 - 1, 1])
    with pytest.raises(ValidationError, match="query_lens"):
        ExplainQuery(query_lens=[2**31])
