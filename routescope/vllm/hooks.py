"""Patching where a name is bound, and running code right after a module is first imported.

``from m import f`` copies ``f`` into the importer's namespace, so replacing ``m.f`` alone
misses every caller that imported it earlier. :class:`Patcher` replaces the object under
every name, in every loaded module, that holds it (aliases included) and can undo exactly
that. :class:`PostImportHook` lets the plugin patch vLLM's module the moment it has executed,
before any importer binds its names, without importing vLLM's modules itself.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any


class Patcher:
    """Replaces objects by identity at their binding sites and remembers each site for :meth:`undo`."""

    def __init__(self) -> None:
        self.sites: list[tuple[ModuleType, str, Any, Any]] = []  # (module, name, original, wrapper)
        self.made: dict[int, tuple[Any, Any]] = {}  # id(wrapper) -> (wrapper, original), for undo's sweep

    def patch_module(self, module: ModuleType, replacements: dict[int, tuple[Any, Any]], *, record: bool = True) -> int:
        """In one module, replace each attribute whose value is one of the originals; return the count."""
        if record:
            self.made.update({id(w): (w, o) for o, w in replacements.values()})
        try:
            items = list(vars(module).items())
        except Exception:  # noqa: BLE001 - exotic module objects (lazy proxies) are skipped
            return 0
        n = 0
        for name, value in items:
            hit = replacements.get(id(value))
            if hit is None or hit[0] is not value:
                continue
            try:
                setattr(module, name, hit[1])
            except Exception:  # noqa: BLE001 - a read-only namespace is skipped, not fatal
                continue
            if record:
                self.sites.append((module, name, hit[0], hit[1]))
            n += 1
        return n

    def patch_everywhere(self, replacements: dict[int, tuple[Any, Any]], modules: Iterable[ModuleType] | None = None,
                         *, record: bool = True) -> int:
        """Every loaded module (a snapshot of sys.modules), so callers that imported the name see the wrapper."""
        if not replacements:
            return 0
        pool = list(sys.modules.values()) if modules is None else list(modules)
        return sum(self.patch_module(m, replacements, record=record) for m in pool if isinstance(m, ModuleType))

    def undo(self) -> int:
        """Put every original back: where this patcher replaced it, and wherever a module imported a
        wrapper by name after the patch (those sites were never recorded, so every module is swept)."""
        n = 0
        for module, name, original, wrapper in reversed(self.sites):
            if getattr(module, name, None) is wrapper:
                setattr(module, name, original)
                n += 1
        n += self.patch_everywhere(dict(self.made), record=False)
        self.sites.clear()
        self.made.clear()
        return n


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader and calls ``after(module)`` once the module has executed."""

    def __init__(self, loader: Any, hook: PostImportHook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):  # type: ignore[override]
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        except BaseException:
            self._hook.rearm()  # the import failed; watch for the next attempt
            raise
        try:
            module.__loader__ = self._loader  # inspect/linecache see the real loader afterwards
        except Exception:  # noqa: BLE001
            pass
        self._hook.callback(module)  # must not raise: the plugin's callback catches everything itself

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class PostImportHook(importlib.abc.MetaPathFinder):
    """A one-shot meta path finder: when ``name`` is imported, run ``callback(module)`` after it executes.

    It finds the spec through the other finders, swaps in a delegating loader and removes itself.
    The callback must never raise (an import of vLLM must not fail because of routescope).
    """

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self._local = threading.local()
        self.fired = False

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def rearm(self) -> None:
        self.fired = False
        self.install()

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname, path, target=None):  # type: ignore[override]
        if fullname != self.name or self.fired or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self.fired = True
        self.remove()
        spec.loader = _Loader(spec.loader, self)
        return spec
