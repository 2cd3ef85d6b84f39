"""Install: the off switch, wrapping at binding sites, idempotence, stand-down. vLLM here is TEST DOUBLES."""

from __future__ import annotations

import logging
import sys

import pytest

from dispatcher import what_if
from routescope import vllm_plugin
from routescope.vllm import plugin

from .conftest import OPS, is_wrapper, prefill_args

ON = {"ROUTESCOPE_VLLM": "1"}


def _install(**kw) -> str:
    return plugin.install(env=kw.pop("env", ON), platform=kw.pop("platform", what_if("gfx942")), **kw)


@pytest.mark.parametrize("value", [None, "", "0", "false", "off", "no"])
def test_off_switch_patches_nothing(vllm_doubles, monkeypatch, value):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    original = ops.rocm_sparse_attn_prefill
    hooks_before = list(sys.meta_path)
    if value is None:
        monkeypatch.delenv("ROUTESCOPE_VLLM", raising=False)
    else:
        monkeypatch.setenv("ROUTESCOPE_VLLM", value)
    vllm_plugin.register()
    assert plugin.current() is None
    assert ops.rocm_sparse_attn_prefill is original and backend.rocm_sparse_attn_prefill is original
    assert sys.meta_path == hooks_before


def test_off_switch_imports_nothing_heavy():
    """With the switch off, register() must not even import the plugin's machinery (torch, dispatcher)."""
    import subprocess

    code = ("import sys, os; os.environ.pop('ROUTESCOPE_VLLM', None); import routescope.vllm_plugin as p; "
            "p.register(); print('routescope.vllm.plugin' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_wraps_every_binding_site_of_an_already_imported_module(vllm_doubles):
    """vLLM 0.33.0's binding sites (doubles.SITES), plus the doubles' alias."""
    d = vllm_doubles()
    ops, backend, models = d.ops(), d.backend(), d.models()
    original = ops.rocm_sparse_attn_prefill
    assert backend.rocm_sparse_attn_prefill is original  # the backend imported the name itself
    assert _install() == "observing"
    for site in (ops.rocm_sparse_attn_prefill, backend.rocm_sparse_attn_prefill, backend.triton_sparse_attn_prefill,
                 *(m.rocm_sparse_attn_prefill for m in models)):
        assert is_wrapper(site) and site.__routescope_original__ is original
    assert is_wrapper(ops.rocm_sparse_attn_decode_bf16) and is_wrapper(backend.rocm_sparse_attn_decode_bf16)
    assert all(is_wrapper(m.rocm_sparse_attn_decode) for m in (ops, *models))
    assert not is_wrapper(backend.rocm_sparse_decode_bf16_num_splits)  # a split count, not an entry point
    assert is_wrapper(ops._get_aiter_pa_prefill_sparse) and is_wrapper(ops._get_aiter_sparse_prefill_opus)
    assert plugin.current().sites == 7  # backend: prefill, its alias, bf16 decode; each model: prefill, decode


def test_import_hook_patches_before_any_importer_binds_the_name(vllm_doubles):
    d = vllm_doubles()
    assert OPS not in sys.modules
    assert _install() == "waiting"
    assert any(type(f).__name__ == "PostImportHook" for f in sys.meta_path)
    backend = d.backend()  # imports the ops module, which the hook patches as soon as it has run
    assert is_wrapper(backend.rocm_sparse_attn_prefill) and is_wrapper(backend.triton_sparse_attn_prefill)
    assert plugin.current().state == "observing"
    assert not any(type(f).__name__ == "PostImportHook" for f in sys.meta_path)  # one shot
    args, expected = prefill_args(8)
    backend.forward_prefill(*args)
    assert (args[-1].float() - expected.float()).abs().max() == 0


def test_register_twice_wraps_once(vllm_doubles, monkeypatch):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    original = ops.rocm_sparse_attn_prefill
    monkeypatch.setenv("ROUTESCOPE_VLLM", "1")
    vllm_plugin.register()
    first = backend.rocm_sparse_attn_prefill
    vllm_plugin.register()
    assert plugin.install(env=ON) == "already"
    assert backend.rocm_sparse_attn_prefill is first
    assert first.__routescope_original__ is original  # not a wrapper of a wrapper


def test_a_second_copy_of_the_plugin_sees_the_marked_functions(vllm_doubles):
    """If the plugin's own state is lost (a module reload), the marks on vLLM's functions still stop a re-wrap."""
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    assert _install() == "observing"
    wrapped = backend.rocm_sparse_attn_prefill
    plugin._plugin = None  # forget, without undoing
    assert _install() == "already"
    assert backend.rocm_sparse_attn_prefill is wrapped and ops.rocm_sparse_attn_prefill is wrapped
    args, _ = prefill_args(4)
    ops.LOG.clear()
    backend.forward_prefill(*args)
    assert [e[0] for e in ops.LOG] == ["prefill", "intree"]


def test_uninstall_puts_every_original_back(vllm_doubles):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    original = ops.rocm_sparse_attn_prefill
    _install()
    plugin.uninstall()
    assert ops.rocm_sparse_attn_prefill is original and backend.triton_sparse_attn_prefill is original
    assert not is_wrapper(ops._get_aiter_pa_prefill_sparse)


def test_uninstall_also_restores_names_bound_after_the_patch(vllm_doubles):
    d = vllm_doubles()
    assert _install() == "waiting"
    backend = d.backend()  # bound the wrapper itself, at import: no recorded site
    assert is_wrapper(backend.rocm_sparse_attn_prefill)
    plugin.uninstall()
    for name in ("rocm_sparse_attn_prefill", "triton_sparse_attn_prefill", "rocm_sparse_attn_decode_bf16"):
        assert not is_wrapper(getattr(backend, name))


def test_mismatched_signature_stands_down_once_without_patching(vllm_doubles, caplog, monkeypatch):
    d = vllm_doubles(signature="old")
    ops, backend = d.ops(), d.backend()
    original = ops.rocm_sparse_attn_prefill
    monkeypatch.setenv("ROUTESCOPE_VLLM", "1")
    with caplog.at_level(logging.INFO, logger="vllm.routescope"):
        vllm_plugin.register()
        vllm_plugin.register()
    p = plugin.current()
    assert p.state == "stood_down"
    assert any("nope_head_dim" in m for m in p.missing)
    warnings = [r for r in caplog.records if "standing down" in r.getMessage()]
    assert len(warnings) == 1 and "nope_head_dim" in warnings[0].getMessage()
    assert ops.rocm_sparse_attn_prefill is original and backend.rocm_sparse_attn_prefill is original
    assert not is_wrapper(ops.rocm_sparse_attn_decode)


def test_mismatch_found_by_the_import_hook_stands_down_inside_vllms_import(vllm_doubles, caplog):
    d = vllm_doubles(signature="old")
    assert _install() == "waiting"
    with caplog.at_level(logging.WARNING, logger="vllm.routescope"):
        backend = d.backend()  # the import itself must succeed
    assert plugin.current().state == "stood_down"
    assert not is_wrapper(backend.rocm_sparse_attn_prefill)
    assert sum("standing down" in r.getMessage() for r in caplog.records) == 1


def test_missing_forward_context_stands_down(vllm_doubles):
    d = vllm_doubles(forward_context=False)
    ops = d.ops()
    assert _install() == "stood_down"
    assert any("forward_context" in m for m in plugin.current().missing)
    assert not is_wrapper(ops.rocm_sparse_attn_prefill)


def test_missing_prefill_function_stands_down(vllm_doubles):
    d = vllm_doubles()
    ops = d.ops()
    del ops.rocm_sparse_attn_prefill
    assert _install() == "stood_down"
    assert "has no rocm_sparse_attn_prefill" in plugin.current().missing[0]


def test_no_exception_escapes_register(vllm_doubles, monkeypatch):
    vllm_doubles()
    monkeypatch.setenv("ROUTESCOPE_VLLM", "1")

    def boom(**kw):
        raise RuntimeError("install exploded")

    monkeypatch.setattr(plugin, "install", boom)
    vllm_plugin.register()  # must return quietly


def test_unexpected_error_while_patching_undoes_and_stands_down(vllm_doubles, monkeypatch):
    d = vllm_doubles()
    ops, backend = d.ops(), d.backend()
    original = ops.rocm_sparse_attn_prefill

    def broken(self, *a, **kw):
        raise RuntimeError("patching exploded halfway")

    monkeypatch.setattr(plugin.Patcher, "patch_everywhere", broken)
    assert _install() == "stood_down"
    assert ops.rocm_sparse_attn_prefill is original and backend.rocm_sparse_attn_prefill is original
    assert "patching exploded" in plugin.current().missing[0]


def test_the_observing_line_names_the_branches_this_vllm_has(vllm_doubles, caplog):
    d = vllm_doubles(getters="opus_only")
    d.ops()
    with caplog.at_level(logging.INFO, logger="vllm.routescope"):
        assert _install() == "observing"
    (line,) = [r.getMessage() for r in caplog.records if "routescope: observing" in r.getMessage()]
    assert "gfx942: no aiter.pa_prefill_sparse branch (no _get_aiter_pa_prefill_sparse)" in line
    assert "gfx942_min_rows" not in line and "512" not in line
    assert "gfx950: aiter.pa_sparse_prefill_opus from 1024 rows (vLLM's _GFX950_AITER_SPARSE_PREFILL_OPUS_MIN_QUERIES)" in line


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_telemetrys_log_records_go_through_vllms_logger(vllm_doubles, monkeypatch):
    """vLLM's one formatted handler sits on its ``vllm`` logger (propagate off): records of routescope's own
    loggers (telemetry's "decode rows in prefill" warning) must reach it, and not the root logger twice."""
    vllm_doubles().ops()
    vllm_handler, root_handler = _Records(), _Records()
    vllm_logger = logging.getLogger("vllm")
    monkeypatch.setattr(vllm_logger, "propagate", False)
    vllm_logger.addHandler(vllm_handler)
    logging.getLogger().addHandler(root_handler)
    try:
        assert _install() == "observing"
        logging.getLogger("routescope.telemetry").warning("decode rows in prefill: a test line")
        assert [r.getMessage() for r in vllm_handler.records] == ["decode rows in prefill: a test line"]
        assert root_handler.records == []
        plugin.uninstall()
        assert logging.getLogger("routescope").handlers == [] and logging.getLogger("routescope").propagate
    finally:
        vllm_logger.removeHandler(vllm_handler)
        logging.getLogger().removeHandler(root_handler)


def test_the_entry_point_line_loads_register():
    """The line for pyproject.toml's [project.entry-points."vllm.general_plugins"] resolves to register()."""
    from importlib.metadata import EntryPoint, entry_points

    ep = EntryPoint(name="routescope", value="routescope.vllm_plugin:register", group="vllm.general_plugins")
    assert ep.load() is vllm_plugin.register
    declared = [e for e in entry_points(group="vllm.general_plugins") if e.name == "routescope"]
    if not declared:
        pytest.skip("pyproject.toml does not declare the vllm.general_plugins entry point yet (see docs/vllm.md)")
    assert declared[0].value == "routescope.vllm_plugin:register"
