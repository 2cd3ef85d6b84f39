"""ROUTESCOPE_VLLM unset: vLLM's own loader runs the plugin and nothing is patched. Then, with vLLM's
modules already imported, the switch on and vLLM's loader again: every binding site is wrapped."""

from __future__ import annotations

import logging
import os
import sys
from importlib.metadata import entry_points

from tests.vllm_real.inside.common import emit, helper_wrapped, import_binding_sites, wrapped_sites

os.environ.pop("ROUTESCOPE_VLLM", None)
from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_general_plugins, load_plugins_by_group  # noqa: E402

load_general_plugins()
off = {
    "plugin_machinery_imported": "routescope.vllm.plugin" in sys.modules,
    "import_hooks": [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "PostImportHook"],
    "routescope_log_handlers": [type(h).__name__ for h in logging.getLogger("routescope").handlers],
}
modules = import_binding_sites()
off_sites = wrapped_sites(modules)
before = {name: {attr: getattr(mod, attr) for attr in off_sites[name]} for name, mod in modules.items()}

os.environ["ROUTESCOPE_VLLM"] = "1"
# load_general_plugins runs once per process (a module flag); this is the loader it runs.
loaded = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)
for register in loaded.values():
    register()
from routescope.vllm import plugin  # noqa: E402

p = plugin.current()
# every wrapper wraps exactly the object that site held before (no wrapper of a wrapper, nothing swapped)
same_original = {name: {attr: getattr(getattr(mod, attr), "__routescope_original__", None) is before[name][attr]
                        for attr in before[name]} for name, mod in modules.items()}
emit(entry_points=[[e.name, e.value] for e in entry_points(group=DEFAULT_PLUGINS_GROUP)], loaded=sorted(loaded),
     off=off, off_sites=off_sites, on_sites=wrapped_sites(modules), same_original=same_original,
     helper_wrapped=helper_wrapped(modules), state=p.state, binding_sites=p.sites, absent=p.absent,
     missing=p.missing)
