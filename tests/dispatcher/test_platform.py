"""Platform detection and what-if platforms; AITER probed lazily, with the reason."""

from __future__ import annotations

import sys
import types

import pytest

from dispatcher.platform import Platform, _arch_of, detect, probe_aiter, what_if


def test_detect_on_this_machine_is_cpu():
    p = detect({"VLLM_ROCM_USE_AITER": "1"})
    assert p.vendor == "cpu" and p.arch == "cpu"
    assert p.aiter_enabled is False, "AITER is never enabled off ROCm"
    assert p.aiter is None, "nothing is imported by detection"


def test_gcn_arch_parsing_like_vllm():
    props = types.SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-")
    assert _arch_of(props, True) == "gfx942"
    assert _arch_of(types.SimpleNamespace(major=9, minor=0), False) == "sm90"


@pytest.mark.parametrize("arch,vendor", [("gfx942", "rocm"), ("GFX950", "rocm"), ("sm90", "cuda"), ("cpu", "cpu")])
def test_what_if(arch, vendor):
    p = what_if(arch)
    assert p.vendor == vendor and p.arch == arch.lower() and p.what_if
    assert p.aiter_enabled == (vendor == "rocm")
    assert p.is_gfx942 == (arch == "gfx942")


def test_what_if_no_aiter():
    assert not what_if("gfx942", aiter=False).aiter_enabled


def test_bad_platform():
    with pytest.raises(ValueError, match="vendor"):
        Platform(vendor="tpu")
    with pytest.raises(ValueError, match="arch"):
        Platform(arch="gfx 942")


def test_probe_aiter_reports_runtime_error_without_rocm(monkeypatch):
    # A stand-in module that fails like `import aiter` does without ROCm (RuntimeError, not ImportError).
    class Loader:
        def find_spec(self, name, path=None, target=None):
            if name == "fake_rocm_aiter":
                raise RuntimeError("ROCm version file not found")
            return None

    monkeypatch.setattr(sys, "meta_path", [Loader(), *sys.meta_path])
    st = probe_aiter("fake_rocm_aiter")
    assert not st.importable and "RuntimeError: ROCm version file not found" in st.reason
    missing = probe_aiter("routescope_definitely_missing_module")
    assert not missing.importable and "not installed" in missing.reason
    ok = probe_aiter("json")
    assert ok.importable


def test_to_dict_says_not_probed():
    d = what_if("gfx942").to_dict()
    assert d["aiter_reason"] == "not probed yet" and d["arch"] == "gfx942"
