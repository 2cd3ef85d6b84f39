"""Demo scaling: rows untouched, per-row work reduced by a factor the page can state exactly."""

from __future__ import annotations

import pytest

from workloads.scale import scaled
from workloads.traffic import DSV4_FLASH, GLM_FLASH


def test_full_scale_is_the_real_shape():
    s = scaled(DSV4_FLASH, full=True)
    assert (s.heads, s.nope_head_dim, s.rope_head_dim, s.topk) == (16, 448, 64, 2048)
    assert s.factor == 1.0 and "full shape" in s.describe()


@pytest.mark.parametrize("spec", [DSV4_FLASH, GLM_FLASH])
def test_cpu_scale_keeps_layout_ratio_and_reports_the_factor(spec):
    s = scaled(spec, full=False)
    assert s.heads == 2 and s.topk == 32
    assert s.nope_head_dim * 8 == spec.nope_head_dim and s.rope_head_dim * 8 == spec.rope_head_dim
    assert s.factor == pytest.approx(s.real_work_per_row / s.work_per_row)
    assert s.factor == pytest.approx(4096)  # 8 (heads) x 64 (top-k) x 8 (lanes)
    assert "1/4096" in s.describe() and "rows per call unchanged" in s.describe()


def test_bad_scale_is_refused():
    with pytest.raises(ValueError, match="bad scale"):
        scaled(GLM_FLASH, full=False, topk=64, kv_pool=32)
