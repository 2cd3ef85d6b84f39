"""Install the observers once per process, at the right moment, and never raise into vLLM.

vLLM loads general plugins early in every process, before the model (and with it the ROCm
sparse MLA module) is imported. If that module is already loaded it is patched at once;
otherwise a one-shot import hook patches it right after it executes, so every later
``from ... import rocm_sparse_attn_prefill`` binds the wrapper. A module that does not look
as expected is left alone: the plugin logs once what was missing and stands down.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from enum import Enum
from types import ModuleType
from typing import Any

from dispatcher.platform import Platform, detect
from dispatcher.policy import DEFAULT_GFX942_MIN_ROWS, DEFAULT_GFX950_MIN_ROWS, Policy, PolicySettings
from dispatcher.types import GuardMode, Kernel

from . import enabled
from .context import ForwardBatch, ModelName, resolve_rank
from .export import make_telemetry
from .hooks import Patcher, PostImportHook
from .layout import Layout, LayoutMismatch, inspect_ops, resolve
from .logs import route_to_vllm, unroute
from .observer import Observer

log = logging.getLogger("vllm.routescope")


class PluginState(str, Enum):
    """Where the plugin stands in this process (compares equal to its value, so logs and JSON read plainly)."""

    NEW = "new"
    OFF = "off"  # ROUTESCOPE_VLLM is not set
    WAITING = "waiting"  # the import hook waits for vLLM's ops module
    OBSERVING = "observing"  # every binding site wrapped
    STOOD_DOWN = "stood_down"  # vLLM's layout was not the one expected: nothing patched
    ALREADY = "already"  # installed once already in this process
    UNINSTALLED = "uninstalled"
    FAILED = "failed"  # setup raised; vLLM runs without the plugin

    def __str__(self) -> str:
        return self.value

MODEL_ENV = "ROUTESCOPE_VLLM_MODEL"


class Plugin:
    """One process's installation: what was patched where, and how to undo it."""

    def __init__(
        self,
        *,
        layout: Layout,
        env: Mapping[str, str],
        importer: Callable[[str], ModuleType],
        platform: Platform | None,
        telemetry_factory: Callable[..., Any] | None,
        experiment_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.layout = layout
        self.experiment_factory = experiment_factory
        self.env = env
        self.importer = importer
        self.platform = platform
        self.telemetry_factory = telemetry_factory
        self.state = PluginState.NEW
        self.missing: list[str] = []
        self.absent: list[str] = []
        self.patcher = Patcher()
        self.observer: Observer | None = None
        self.hook: PostImportHook | None = None
        self.sites = 0
        self.routed_logs = False

    def start(self) -> PluginState:
        self.routed_logs = route_to_vllm()
        name = self.layout.ops_module
        module = sys.modules.get(name)
        if module is not None:
            self.attach(module)
        elif any(getattr(f, "name", None) == name and type(f).__name__ == "PostImportHook" for f in sys.meta_path):
            self.state = PluginState.ALREADY  # a copy of this plugin (module reloaded) is already waiting
        else:
            self.hook = PostImportHook(name, self.attach)
            self.hook.install()
            self.state = PluginState.WAITING
            log.debug("routescope: waiting for %s to be imported", name)
        return self.state

    def attach(self, module: ModuleType) -> None:
        """Patch ``module`` and every binding site; on any surprise undo and stand down. Never raises."""
        try:
            self._attach(module)
        except Exception as exc:  # noqa: BLE001
            try:
                self.patcher.undo()
            except Exception:  # noqa: BLE001
                pass
            self.stand_down([f"unexpected {type(exc).__name__}: {exc}"], exc)

    def stand_down(self, missing: list[str], exc: BaseException | None = None) -> None:
        self.state = PluginState.STOOD_DOWN
        self.missing = missing
        log.warning("routescope: vLLM's %s is not laid out as this plugin expects (%s); standing down, "
                    "nothing is patched and vLLM runs as it would without routescope",
                    self.layout.ops_module, "; ".join(missing), exc_info=exc)

    def _optional(self, target: str) -> Any:
        try:
            return resolve(target, self.importer)
        except Exception:  # noqa: BLE001
            return None

    def _attach(self, module: ModuleType) -> None:
        layout = self.layout
        try:
            found = inspect_ops(module, layout)
        except LayoutMismatch as exc:
            self.stand_down(exc.missing)
            return
        if getattr(found.prefill, "__routescope__", False):
            self.state = PluginState.ALREADY
            return
        try:
            get_context = resolve(layout.forward_context, self.importer)
        except Exception as exc:  # noqa: BLE001 - ImportError, AttributeError, or the module's own error
            self.stand_down([f"forward context {layout.forward_context}: {type(exc).__name__}: {exc}"])
            return
        if not callable(get_context):
            self.stand_down([f"{layout.forward_context} is not callable"])
            return
        is_available = self._optional(layout.forward_context_available)
        config_getter, silent = None, False
        for target in layout.config_getters:
            config_getter = self._optional(target)
            if callable(config_getter):
                silent = target.endswith("_or_none")
                break
        if not callable(config_getter):
            config_getter = None
            found.absent.append("no vLLM config getter (the model label is 'unknown' unless ROUTESCOPE_VLLM_MODEL)")
        rank_getters = [g for g in (self._optional(t) for t in layout.rank_getters) if callable(g)]
        model = ModelName(config_getter, override=self.env.get(MODEL_ENV, "").strip() or None,
                          max_attempts=None if silent else 8)
        model.get()  # vLLM imports this module while it builds the model, under its config
        absent_branches = frozenset(k for name, k in layout.getters if name not in found.getters)
        gates, gate_text = vllm_gates(module, found)
        env = self.env
        absent_gates = tuple(g for k, g in ((Kernel.AITER_PA_PREFILL_SPARSE, "gfx942_min_rows"),
                                            (Kernel.AITER_OPUS, "gfx950_min_rows")) if k in absent_branches)
        factory = self.telemetry_factory or (lambda **kw: make_telemetry(env=env, absent_gates=absent_gates, **kw))
        observer = Observer(
            param_index=found.param_index, param_default=found.param_default,
            batch_reader=ForwardBatch(get_context, is_available if callable(is_available) else None),
            model=model, make_platform=self._make_platform, policy=self._policy(found),
            make_telemetry=factory, resolve_rank=lambda: resolve_rank(rank_getters, env),
            absent_branches=absent_branches, vllm_gates=gates, vllm_gate_text=gate_text,
        )
        observer.router = self._router(module, observer)
        replacements: dict[int, tuple[Any, Any]] = {
            id(found.prefill): (found.prefill, observer.wrap_prefill(found.prefill))}
        for getter, kernel in found.getters.values():
            if not getattr(getter, "__routescope__", False):
                replacements[id(getter)] = (getter, observer.wrap_getter(getter, kernel))
        for fn in found.decodes.values():
            if not getattr(fn, "__routescope__", False):
                replacements[id(fn)] = (fn, observer.wrap_decode(fn, _q_index(fn)))
        self.patcher.patch_module(module, replacements)
        others = [m for m in list(sys.modules.values()) if m is not module]
        self.sites = self.patcher.patch_everywhere(replacements, others)
        self.observer = observer
        self.absent = found.absent
        self.state = PluginState.OBSERVING
        log.info("routescope: observing %s.%s (%d other binding sites), getters %s, decode entries %s; %s",
                 module.__name__, layout.prefill, self.sites, sorted(found.getters) or "none",
                 sorted(found.decodes) or "none", _branches(layout, found, observer.policy))
        if found.absent:
            log.info("routescope: not found in this vLLM (observed without them): %s", "; ".join(found.absent))

    def _router(self, module: ModuleType, observer: Observer) -> Any:
        """The experiment router (routing.py) over this module; None when no experiment can run here (logged)."""
        try:
            from .arms import VllmArms
            from .experiment import SWITCH_ENV, flush_interval, registry_factory
            from .routing import Router

            make = (self.experiment_factory or registry_factory)(env=self.env)
            if make is None:
                return None
            log.info("routescope: an experiment started in the multiprocess directory routes its arm-B calls in this "
                     "process (%s=0 keeps the plugin to observing)", SWITCH_ENV)
            return Router(arms=VllmArms(module, aiter_module=self.layout.aiter_module), make_registry=make,
                          batch_invariant=self._batch_invariant(), flush_interval_s=flush_interval(self.env))
        except Exception as exc:  # noqa: BLE001 - without a router the plugin observes, as before experiments
            log.warning("routescope: experiments cannot run in this process (%s: %s); the plugin only observes",
                        type(exc).__name__, exc, exc_info=exc)
            return None

    def _batch_invariant(self) -> bool:
        """vLLM's own reading of VLLM_BATCH_INVARIANT (vllm.envs), else the variable as vLLM parses it."""
        try:
            return bool(resolve(self.layout.batch_invariant, self.importer))
        except Exception:  # noqa: BLE001 - no vllm.envs, or a value vLLM's int() rejects
            raw = self.env.get("VLLM_BATCH_INVARIANT", "0").strip()
            return raw not in ("", "0") and raw.lower() not in ("false", "no", "off")

    def _policy(self, found: Any) -> Policy:
        """vLLM's own thresholds when its module defines them; else ROUTESCOPE_* or the defaults."""
        try:
            settings = PolicySettings()
            g942, g950 = settings.gfx942_min_rows, settings.gfx950_min_rows
        except Exception:  # noqa: BLE001 - a malformed ROUTESCOPE_* variable must not stop vLLM
            g942, g950 = DEFAULT_GFX942_MIN_ROWS, DEFAULT_GFX950_MIN_ROWS
        return Policy(
            gfx942_min_rows=found.gfx942_min_rows if found.gfx942_min_rows is not None else g942,
            gfx950_min_rows=found.gfx950_min_rows if found.gfx950_min_rows is not None else g950,
            guard=GuardMode.OBSERVE, name="vllm",
        )

    def _make_platform(self, q: Any) -> Platform:
        if self.platform is not None:
            return self.platform
        index = getattr(getattr(q, "device", None), "index", None)
        return detect(device_index=index or 0)

    def undo(self) -> None:
        router = getattr(self.observer, "router", None)
        if router is not None and router.registry is not None:
            try:  # this process's experiments stop being watched; the directory's files stay
                router.registry.close()
            except Exception:  # noqa: BLE001
                pass
        if self.hook is not None:
            self.hook.remove()
        self.patcher.undo()
        if self.routed_logs:
            unroute()
        self.state = PluginState.UNINSTALLED

    def status(self) -> dict:
        out = {"state": self.state.value, "module": self.layout.ops_module, "missing": self.missing,
               "absent": self.absent, "binding_sites": self.sites}
        if self.observer is not None:
            out.update(self.observer.status())
        return out


def _module_attr_call(module: ModuleType, name: str) -> Callable[..., Any]:
    """Call ``module.name`` as vLLM does: looked up at each call, so a replaced attribute is the one used."""
    return lambda *args: getattr(module, name)(*args)


def _module_flag(module: ModuleType, name: str) -> Callable[..., bool]:
    """vLLM's arch flag ``module.name`` as a gate taking the predicate's arguments: looked up at each call,
    as vLLM's inline branch reads the global, and taken for its truth as that branch's ``if`` takes it."""
    return lambda *_args: bool(getattr(module, name, False))


def vllm_gates(module: ModuleType, found: Any) -> tuple[dict[Kernel, Callable[..., Any]], dict[Kernel, str]]:
    """What vLLM's own code lets the plugin ask before a call, per branch, and how a decline reads.

    A branch factored into a predicate (0.33.0's OPUS: ``_can_use_aiter_sparse_prefill_opus``) is asked
    that; a branch written inline (the seed's gfx942 one) has none, and only its arch flag
    (``_ON_GFX942``) is vLLM's own to read: its other conditions (dtypes, the row threshold read from
    vLLM's constant) are the policy's own gates.
    """
    gates: dict[Kernel, Callable[..., Any]] = {}
    text: dict[Kernel, str] = {}
    for name, kernel in found.gates.items():
        gates[kernel] = _module_attr_call(module, name)
        text[kernel] = f"vLLM's gate {name} declines this call"
    for name, kernel in found.flags.items():
        gates[kernel] = _module_flag(module, name)
        text[kernel] = f"vLLM's arch flag {name} is False: its inline {kernel} branch is not taken"
    return gates, text


def _branches(layout: Layout, found: Any, policy: Policy) -> str:
    """The AITER branches this vLLM has, each with its row threshold and its source; absent ones named."""
    rows = {Kernel.AITER_PA_PREFILL_SPARSE: ("gfx942", policy.gfx942_min_rows, found.gfx942_min_rows,
                                             layout.gfx942_min_rows_names[0]),
            Kernel.AITER_OPUS: ("gfx950", policy.gfx950_min_rows, found.gfx950_min_rows,
                                layout.gfx950_min_rows_names[0])}
    parts = []
    for getter, kernel in layout.getters:
        arch, n, own, const = rows[kernel]
        if getter not in found.getters:
            parts.append(f"{arch}: no {kernel} branch (no {getter})")
            continue
        source = f"vLLM's {const}" if own is not None else "routescope's threshold: this vLLM defines none"
        gates = [f", vLLM's gate {g}" for g, k in found.gates.items() if k is kernel]
        flags = [f", vLLM's arch flag {f} (an inline branch)" for f, k in found.flags.items() if k is kernel]
        parts.append(f"{arch}: {kernel} from {n} rows ({source})" + "".join(gates + flags))
    return "branches: " + "; ".join(parts)


def _q_index(fn: Callable[..., Any]) -> int:
    try:
        names = list(inspect.signature(getattr(fn, "__routescope_original__", fn)).parameters)
        return names.index("q") if "q" in names else 0
    except (TypeError, ValueError):
        return 0


_lock = threading.Lock()
_plugin: Plugin | None = None


def install(
    *,
    env: Mapping[str, str] | None = None,
    layout: Layout | None = None,
    importer: Callable[[str], ModuleType] = importlib.import_module,
    platform: Platform | None = None,
    telemetry_factory: Callable[..., Any] | None = None,
    experiment_factory: Callable[..., Any] | None = None,
) -> PluginState:
    """Idempotent: a ``PluginState`` (off, waiting, observing, stood_down, already or failed). Never raises."""
    global _plugin
    try:
        env = os.environ if env is None else env
        if not enabled(env):
            return PluginState.OFF
        with _lock:
            if _plugin is not None:
                return PluginState.ALREADY
            plugin = Plugin(layout=layout or Layout(), env=env, importer=importer, platform=platform,
                            telemetry_factory=telemetry_factory, experiment_factory=experiment_factory)
            _plugin = plugin
            return plugin.start()
    except Exception as exc:  # noqa: BLE001 - vLLM calls plugins without a try
        log.warning("routescope: plugin setup failed (%s: %s); vLLM runs without it", type(exc).__name__, exc,
                    exc_info=exc)
        return PluginState.FAILED


def uninstall() -> None:
    """Undo every patch and the import hook (tests; a running server can also switch itself back)."""
    global _plugin
    with _lock:
        plugin, _plugin = _plugin, None
    if plugin is not None:
        plugin.undo()


def current() -> Plugin | None:
    return _plugin
