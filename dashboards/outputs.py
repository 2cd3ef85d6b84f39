"""dispatcher/outputs.py's output-path checks for the builders, loaded without the dispatcher package's own imports.

``import dispatcher.outputs`` runs dispatcher/__init__.py, which imports torch (seconds); the builders need none of
it, so the module is loaded from its file alone. The checks and their messages are that module's, unchanged.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

_NAME = "_routescope_dispatcher_outputs"


def outputs() -> ModuleType:
    """dispatcher/outputs.py as a module (once per process)."""
    if _NAME in sys.modules:
        return sys.modules[_NAME]
    package = importlib.util.find_spec("dispatcher")  # finds the package without running its __init__
    if package is None or package.origin is None:
        raise ModuleNotFoundError("dispatcher")
    spec = importlib.util.spec_from_file_location(_NAME, Path(package.origin).with_name("outputs.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module
