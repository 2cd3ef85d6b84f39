"""The seed PR's gfx942 branch applied to a copy of vLLM 0.33.0's module (seed_gfx942.patch), a what-if
gfx942, and a stand-in for AITER's leaf kernel: the plugin labels what vLLM's patched code launched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .conftest import VENV, samples
from .test_forward_context import VLLM_LINE

SCRIPT = "seed_gfx942"
PATCH = Path(__file__).with_name("seed_gfx942.patch")
REL = Path("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py")
PA, INTREE = "aiter.pa_prefill_sparse", "intree.ragged_prefill"


def prepare(tmp: Path) -> dict[str, str]:
    """Copy the installed module and apply the patch to the copy (``git apply``: no ``patch`` needed)."""
    site = next((VENV / "lib").glob(f"python3.*/site-packages/{REL}"))
    (tmp / REL).parent.mkdir(parents=True)
    shutil.copy(site, tmp / REL)
    subprocess.run(["git", "apply", str(PATCH)], cwd=tmp, check=True, capture_output=True, timeout=60)
    return {"ROUTESCOPE_VLLM": "1", "VLLM_ROCM_USE_AITER": "1", "ROUTESCOPE_SEED_MODULE": str(tmp / REL)}


def test_the_patch_adds_the_branch_and_the_plugin_wraps_its_getter(run):
    assert run.data["state"] == "waiting"
    assert run.data["sites"]["vllm.v1.attention.ops.rocm_aiter_mla_sparse"]["_get_aiter_pa_prefill_sparse"] is True
    assert run.data["policy"]["gfx942_min_rows"] == 512  # read from the patched module's constant


def test_calls_of_512_rows_and_more_launch_the_aiter_kernel_and_are_labelled_so(run):
    assert run.data["stand_in_calls"] == [600, 512, 512]  # two direct calls, then the 512-row pure decode
    s = run.data["samples"]
    assert samples(s, "routescope_calls_total", kernel=PA, impl="aiter") == 3
    assert samples(s, "routescope_calls_total", kernel=PA, rows_bucket="512-1023") == 3
    assert samples(s, "routescope_decisions_total", kernel=PA, reason="gfx942_pa_prefill_sparse") == 3
    assert run.data["mismatches"] == {} and run.data["errors"] == {}


def test_smaller_calls_stay_in_tree_and_are_labelled_so(run):
    s = run.data["samples"]
    assert samples(s, "routescope_calls_total", kernel=INTREE, impl="triton") == 2  # 8 rows direct, 4-row decode
    assert samples(s, "routescope_decisions_total", kernel=INTREE, reason="gfx942_min_rows") == 2


def test_outputs_match_the_reference_on_both_paths(run):
    assert all(err < 1e-3 for err in run.data["errs"].values()), run.data["errs"]


def test_a_glm_style_pure_decode_through_it_fires_decode_in_prefill(run):
    s = run.data["samples"]
    assert samples(s, "routescope_decode_in_prefill_calls_total", kernel=PA, call_class="pure_decode") == 1
    assert samples(s, "routescope_decode_in_prefill_rows_total", kernel=PA, call_class="pure_decode") == 512
    assert samples(s, "routescope_decode_in_prefill_calls_total", kernel=INTREE, call_class="pure_decode") == 1
    warnings = [m for m in map(VLLM_LINE.match, run.stdout.splitlines()) if m and "decode rows in prefill" in m["msg"]]
    assert sorted(PA in m["msg"] for m in warnings) == [False, True]  # one per model x kernel


def test_vllms_own_log_says_it_took_the_branch_and_the_observing_line_has_its_threshold(run):
    assert "Using AITER pa_prefill_sparse for sparse MLA prefill on gfx942" in run.stdout
    line = next(m["msg"] for m in map(VLLM_LINE.match, run.stdout.splitlines()) if m and "observing" in m["msg"])
    assert f"gfx942: {PA} from 512 rows (vLLM's _GFX942_AITER_PA_PREFILL_SPARSE_MIN_QUERIES)" in line




def test_a_call_vllms_arch_flag_turns_away_is_in_tree_from_its_start(run):
    """The inline branch has no predicate to ask, but its arch flag is vLLM's own: with _ON_GFX942 off, a
    600-row call is labelled in-tree before telemetry sees it, so a flush in mid-call shows no AITER call."""
    d = run.data["declined"]
    (mid,) = d["mid_call"]
    assert samples(mid, "routescope_calls_total", kernel=PA) == 3  # the three earlier AITER calls, no fourth
    assert samples(mid, "routescope_decisions_total", kernel=INTREE, reason="gfx942_declined") == 1
    after = d["after"]
    assert samples(after, "routescope_calls_total", kernel=PA) == 3
    assert samples(after, "routescope_calls_total", kernel=INTREE, impl="triton", rows_bucket="512-1023") == 1
    assert samples(after, "routescope_decisions_total", kernel=INTREE, reason="gfx942_declined") == 1
    assert d["stand_in_calls"] == [600, 512, 512] and d["in_tree_calls"] == [600] and d["mismatches"] == {}
