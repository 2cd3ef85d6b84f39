"""vLLM's own loader finds the plugin; every binding site of vLLM 0.33.0 is wrapped whether the plugin
comes before or after vLLM's modules; with ROUTESCOPE_VLLM unset nothing is patched."""

from __future__ import annotations

import pytest

SCRIPT = "off_then_on"

OPS = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
BACKEND = "vllm.v1.attention.backends.mla.rocm_aiter_mla_sparse"
V4, V41 = "vllm.models.deepseek_v4.amd.rocm", "vllm.models.deepseek_v41.amd.rocm"
# what vLLM 0.33.0 binds, read from its files: the ops module defines the entries and the OPUS getter;
# the backend imports the prefill and the bf16 decode; the two DeepSeek-V4 ROCm models the prefill and decode
SITES = {
    OPS: {"_get_aiter_sparse_prefill_opus", "rocm_sparse_attn_decode", "rocm_sparse_attn_decode_bf16",
          "rocm_sparse_attn_prefill"},
    BACKEND: {"rocm_sparse_attn_decode_bf16", "rocm_sparse_attn_prefill"},
    V4: {"rocm_sparse_attn_decode", "rocm_sparse_attn_prefill"},
    V41: {"rocm_sparse_attn_decode", "rocm_sparse_attn_prefill"},
}


def test_vllms_loader_finds_the_entry_point(run):
    assert ["routescope", "routescope.vllm_plugin:register"] in run.data["entry_points"]
    assert "routescope" in run.data["loaded"]


def test_switch_off_patches_nothing_and_imports_nothing_heavy(run):
    off = run.data["off"]
    assert off == {"plugin_machinery_imported": False, "import_hooks": [], "routescope_log_handlers": []}
    assert {m: set(s) for m, s in run.data["off_sites"].items()} == SITES
    assert not any(w for sites in run.data["off_sites"].values() for w in sites.values())


def test_switched_on_after_vllms_modules_every_binding_site_is_wrapped(run):
    assert run.data["state"] == "observing", run.data["missing"]
    assert run.data["on_sites"] == {m: dict.fromkeys(sorted(s), True) for m, s in SITES.items()}
    assert all(ok for sites in run.data["same_original"].values() for ok in sites.values())
    assert run.data["binding_sites"] == 6  # the backend's 2, and 2 in each model module


def test_the_split_count_helper_the_backend_also_imports_is_left_alone(run):
    """``rocm_sparse_decode_bf16_num_splits`` returns a number, it runs no attention: not a decode entry."""
    assert run.data["helper_wrapped"] == {OPS: False, BACKEND: False}


def test_every_script_ran_against_the_pinned_vllm(run):
    """conftest fails any script whose vllm.__version__ is not the pinned one; this one says it outright."""
    assert run.data["vllm_version"] == "0.33.0"


@pytest.mark.parametrize("absent", ["no _get_aiter_pa_prefill_sparse"])
def test_the_missing_gfx942_branch_is_reported(run, absent):
    assert any(absent in a for a in run.data["absent"])
