"""The wrappers' shared state: label each call of vLLM's real function and hand it to telemetry.

Hot path per prefill call: read a few tensor attributes into a CallShape, read host ints
from the forward context, look the decision up in a dict, and call the telemetry probe.
Everything of ours runs inside ``try``: a failure is counted and logged once, and vLLM's
original function is called exactly once with the arguments it was given.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from dispatcher.platform import Platform
from dispatcher.policy import Policy, decide
from dispatcher.types import Batch, CallShape, Decision, Gate, Kernel

from .calls import AITER_KERNELS, Call, PoolBuckets, call_shape, is_compiling, mark, positional_capacity
from .context import ForwardBatch, ModelName

_getpid = os.getpid
log = logging.getLogger("vllm.routescope")

_BRANCH = {Kernel.AITER_PA_PREFILL_SPARSE: "gfx942", Kernel.AITER_OPUS: "gfx950"}
_OBSERVED_CODE = {Kernel.AITER_PA_PREFILL_SPARSE: ("gfx942_pa_prefill_sparse", "gfx942_pa"),
                  Kernel.AITER_OPUS: ("gfx950_opus", "gfx950_opus")}
MAX_DECISIONS = 4096
_READ = ("q", "kv", "indices", "attn_sink", "output", "head_dim", "nope_head_dim", "rope_head_dim",
         "ragged_indices", "ragged_indptr")


class Observer:
    """Per-process state behind every wrapper; telemetry is built on the first call in each process."""

    def __init__(
        self,
        *,
        param_index: dict[str, int],
        param_default: dict[str, Any],
        batch_reader: ForwardBatch,
        model: ModelName,
        make_platform: Callable[[Any], Platform],
        policy: Policy,
        make_telemetry: Callable[..., Any],
        resolve_rank: Callable[[], str],
        absent_branches: frozenset[Kernel] = frozenset(),
        vllm_gates: Mapping[Kernel, Callable[..., Any]] | None = None,
        vllm_gate_text: Mapping[Kernel, str] | None = None,
    ) -> None:
        self.param_index = param_index
        self.param_default = param_default
        # positional index per _READ name (-1: not a parameter, read as None); None: some name is keyword-only
        required = [param_index.get(n) for n in _READ[:8]]
        self._read_index = None if None in required else tuple(param_index.get(n, -1) for n in _READ)
        self._read_max = max(required) if None not in required else 0
        self._read_top = -1 if self._read_index is None or min(self._read_index) < 0 else max(self._read_index)
        self._getter = operator.itemgetter(*self._read_index) if self._read_top >= 0 else None
        self.batch_reader = batch_reader
        self.model = model
        self.make_platform = make_platform
        self.policy = policy
        self.make_telemetry = make_telemetry
        self.resolve_rank = resolve_rank
        self.router: Any = None  # a routing.Router while the plugin routes an experiment's calls; None: observe only
        self.absent_branches = absent_branches
        self.vllm_gates = dict(vllm_gates or {})  # kernel -> vLLM's own predicate (or arch flag) for its branch
        self.vllm_gate_text = dict(vllm_gate_text or {})  # kernel -> how that gate's decline reads
        self.symbol_missing: set[Kernel] = set()
        self.platform: Platform | None = None
        self.telemetry: Any = None
        self.probe: Any = None
        self._arity = (6, 2, 2)  # positional arguments the probe's start, stop and error take (older probes: fewer)
        self.rank = "0"
        self.errors: Counter[str] = Counter()
        self.mismatches: Counter[tuple[str, str]] = Counter()
        self.calls = 0
        self.decode_calls = 0
        self._decisions: dict[tuple, Decision] = {}
        self._pools = PoolBuckets()  # kv pool bytes -> their size bucket, for call_shape
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._logged: set[str] = set()

    # ---- bookkeeping -------------------------------------------------------------------
    def failed(self, stage: str, exc: BaseException) -> None:
        """Count one failure of our own logic; log the first of each stage with its traceback."""
        self.errors[stage] += 1
        tel = self.telemetry  # routescope_telemetry_errors_total{stage="probe"}: our wrappers are the probe's caller
        if tel is not None:
            try:
                tel.count_error("probe")
            except Exception:  # noqa: BLE001 - a stand-in telemetry without it must not fail vLLM's call
                pass
        if stage not in self._logged:
            self._logged.add(stage)
            log.warning("routescope: %s failed (%s: %s); vLLM's call went on as if routescope were absent; "
                        "further failures of this stage are only counted", stage, type(exc).__name__, exc, exc_info=exc)

    def log_once(self, key: str, level: int, msg: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    def status(self) -> dict:
        return {
            "calls": self.calls, "decode_calls": self.decode_calls, "errors": dict(self.errors),
            "mismatches": {f"{a}->{b}": n for (a, b), n in self.mismatches.items()},
            "symbol_missing": sorted(k.value for k in self.symbol_missing),
            "absent_branches": sorted(k.value for k in self.absent_branches),
            "platform": None if self.platform is None else self.platform.to_dict(),
            "policy": self.policy.to_dict(), "model": self.model.value, "rank": self.rank,
            "telemetry": self.telemetry is not None,
            **({"routing": self.router.status()} if self.router is not None else {}),
        }

    # ---- lazy per-process setup ----------------------------------------------------------
    def ready(self, q: Any) -> bool:
        """Build platform and telemetry once per process (after a fork too); False: observe nothing."""
        pid = os.getpid()
        if self._pid == pid:
            return self.probe is not None
        with self._lock:
            if self._pid != pid:
                self.telemetry = self.probe = None
                try:
                    self.platform = self.make_platform(q)
                    self.rank = self.resolve_rank()
                    self.telemetry = self.make_telemetry(
                        platform=self.platform, policy=self.policy, model=self.model.get(), rank=self.rank)
                    self.probe = self.telemetry.probe
                    self._arity = tuple(positional_capacity(f) for f in (self.probe.start, self.probe.stop,
                                                                         self.probe.error))
                    self._decisions.clear()
                except Exception as exc:  # noqa: BLE001 - no telemetry: vLLM runs on, unobserved
                    self.failed("setup", exc)
                    self.telemetry = self.probe = None
                if self.router is not None and self.probe is not None:
                    try:  # this process's experiments (routing.py): watched from now on, routed once one runs
                        self.router.start_process(self.platform, self.policy)
                    except Exception as exc:  # noqa: BLE001 - no experiment here: the plugin observes
                        self.failed("experiments", exc)
                        self.router = None
                self._pid = pid
        return self.probe is not None

    # ---- decisions ----------------------------------------------------------------------
    def decide(self, shape: CallShape, batch: Batch, gate_args: tuple = ()) -> tuple[tuple, Decision]:
        """The call's decision-cache key and decision (``before`` looks the key up inline first: same key)."""
        rows = shape[0]
        policy = self.policy
        key = (shape[1:], rows >= policy.gfx950_min_rows, rows >= policy.gfx942_min_rows, batch.call_class)
        hit = self._decisions.get(key)
        if hit is None:
            assert self.platform is not None
            hit = self._adjust(decide(shape, self.platform, policy, Batch(batch.call_class)), gate_args)
            if len(self._decisions) < MAX_DECISIONS:
                self._decisions[key] = hit
        return key, hit

    def _vllm_declines(self, k: Kernel, gate_args: tuple) -> bool:
        """vLLM's own gate for the branch: its predicate (0.33.0: _can_use_aiter_sparse_prefill_opus), or,
        for a branch written inline (the seed's gfx942 one), its arch flag (_ON_GFX942).

        Read on a decision-cache miss only: the predicate reads what the cache key holds (rows
        against the threshold, dtypes, strides, devices, the sink), plus vLLM's own arch flag.
        """
        gate = self.vllm_gates.get(k)
        if gate is None or not gate_args:
            return False
        q, kv, sink, output = gate_args
        return not gate(q, kv.squeeze(1) if kv.dim() == 3 else kv, None if sink is None else sink[: q.shape[1]], output)

    def _adjust(self, d: Decision, gate_args: tuple = ()) -> Decision:
        """Predict what this vLLM build does: a branch it lacks, a call its gate declines, a missing symbol."""
        k = d.kernel
        if k not in AITER_KERNELS:
            return d
        branch = _BRANCH[k]
        if k in self.absent_branches:
            gate = Gate(f"vllm.{branch}_branch", False, f"this vLLM has no {k} branch (no getter for it)")
            code, reason = "arch_not_gated", f"in-tree: this vLLM build has no {k} branch"
        elif k in self.symbol_missing:
            gate = Gate(f"{branch}.symbol", False, f"vLLM's getter for {k} returned None")
            code, reason = f"{branch}_symbol", f"in-tree: {k} is not importable here"
        elif self._vllm_declines(k, gate_args):
            gate = Gate(f"vllm.{branch}_gate", False, self.vllm_gate_text.get(k, f"vLLM's own gate for {k} declines"))
            code, reason = f"{branch}_declined", f"in-tree: vLLM's gate declines {k} for this call"
        else:
            return d
        return Decision(Kernel.INTREE_RAGGED_PREFILL, reason, code, d.gates + (gate,), "intree", d.call_class)

    def _observed(self, call: Call, launched: Kernel) -> None:
        """vLLM launched something else than predicted: learn it for this call class and log once."""
        pred = call.decision
        self.mismatches[(pred.kernel.value, launched.value)] += 1
        if call.saw_none:
            self.symbol_missing |= call.saw_none
            self._decisions.clear()  # every cached prediction of that branch is now stale
        if launched in AITER_KERNELS:
            code, branch = _OBSERVED_CODE[launched]
        else:
            b = _BRANCH.get(pred.kernel, "intree")
            code = f"{b}_symbol" if pred.kernel in call.saw_none else f"{b}_declined"
            branch = "intree"
        gate = Gate("vllm.observed", True, f"vLLM launched {launched} where the policy predicted {pred.kernel}")
        fixed = Decision(launched, f"observed: vLLM launched {launched} ({pred.kernel} predicted: {pred.reason})",
                         code, pred.gates + (gate,), branch, pred.call_class)
        if len(self._decisions) < MAX_DECISIONS:
            self._decisions[call.key] = fixed
        self.log_once(f"mismatch:{pred.kernel}:{launched}", logging.WARNING,
                      "routescope: vLLM launched %s where routescope's policy predicted %s (%s); this call "
                      "is recorded as predicted, later calls of its class as launched", launched, pred.kernel,
                      pred.reason)

    # ---- the prefill wrapper ------------------------------------------------------------
    def _arg(self, args: tuple, kwargs: dict, name: str) -> Any:
        i = self.param_index.get(name)
        if i is not None and i < len(args):
            return args[i]
        return kwargs.get(name, self.param_default.get(name))

    def _read(self, args: tuple, kwargs: dict) -> tuple:
        """The arguments the observer reads, in _READ order; all-positional calls take the fast path."""
        idx = self._read_index
        n = len(args)
        if idx is not None and not kwargs and n > self._read_max:
            if 0 <= self._read_top < n:  # every read parameter was passed positionally
                return self._getter(args)
            dflt = self.param_default
            return tuple(args[i] if 0 <= i < n else dflt.get(name) for i, name in zip(idx, _READ))
        arg = self._arg
        return tuple(arg(args, kwargs, name) for name in _READ)

    def before(self, args: tuple, kwargs: dict) -> Call | None:
        q, kv, indices, attn_sink, output, hd, nope, rope, r_indices, r_indptr = self._read(args, kwargs)
        if (self._pid != _getpid() or self.probe is None) and not self.ready(q):  # ready(), its fast path inline
            return None
        self.calls += 1
        shape = call_shape(q, kv, indices, attn_sink, output, r_indices is not None and r_indptr is not None,
                           hd, nope, rope, r_indices, self._pools)
        try:
            batch = self.batch_reader(shape.rows)
        except Exception as exc:  # noqa: BLE001 - an odd metadata object reads as unknown
            self.failed("metadata", exc)
            batch = Batch()
        rows = shape[0]  # decide()'s key and lookup, inline: a hit pays no call and builds no gate arguments
        policy = self.policy
        key = (shape[1:], rows >= policy.gfx950_min_rows, rows >= policy.gfx942_min_rows, batch.call_class)
        decision = self._decisions.get(key)
        if decision is None:
            key, decision = self.decide(shape, batch, (q, kv, attn_sink, output) if self.vllm_gates else ())
        router = self.router
        route = None
        if router is not None and (router.chooser is not None or router.batch_invariant):  # routing.py
            route = router.route(decision, shape, batch, self.model.get(), q, self.batch_reader.position,
                                 args, kwargs, self._arg)
        return self.start(key, decision if route is None else route.shown, shape, batch, q, route)

    def start(self, key: tuple, decision: Decision, shape: CallShape, batch: Batch, q: Any,
              route: Any = None) -> Call | None:
        """Hand one call to the probe; None (no routing) when the probe fails, else the call in flight."""
        call = Call(key, decision, getattr(self._local, "call", None))
        call.route = route
        try:
            call.announced = "aiter" if decision.kernel in AITER_KERNELS else "triton"  # what will be attempted
            told = (call.announced,) if self._arity[0] >= 7 else ()
            call.token = self.probe.start(decision, shape, batch, self.model.get(), q, None, *told)
            if not told:
                call.announced = None
        except Exception as exc:  # noqa: BLE001
            self.failed("probe", exc)
            if route is None:
                return None
            call.observed = False  # a chosen call still runs its arms; the probe is not told its end
        self._local.call = call
        return call

    def after(self, call: Call, exc: BaseException | None) -> None:
        """Never raises; restores the enclosing call (if any) for the getters to see."""
        if not call.observed:
            self._local.call = call.prev
            return
        try:
            if exc is not None:  # the impl label says what vLLM attempted (aiter or triton)
                extra = (call.impl(raised=True), call.announced)[: max(0, self._arity[2] - 2)]
                self.probe.error(call.token, exc, *extra)
                return
            launched = call.launched or Kernel.INTREE_RAGGED_PREFILL
            if launched is not call.decision.kernel:
                self._observed(call, launched)
            self.probe.stop(call.token, call.impl(), *((call.announced,) if self._arity[1] >= 3 else ()))
        except Exception as e:  # noqa: BLE001
            self.failed("probe", e)
        finally:
            self._local.call = call.prev

    def wrap_prefill(self, original: Callable[..., Any]) -> Callable[..., Any]:
        obs = self
        compiling = is_compiling()

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if compiling():  # inside a torch.compile trace: stay out of the graph
                return original(*args, **kwargs)
            call = None
            try:
                call = obs.before(args, kwargs)
            except Exception as exc:  # noqa: BLE001 - fail open: vLLM's call goes on
                obs.failed("before", exc)
            if call is None:
                return original(*args, **kwargs)
            if call.route is not None:
                return obs.router.run(obs, call, original, args, kwargs)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                obs.after(call, exc)
                raise
            obs.after(call, None)
            return result

        return mark(wrapper, original)

    # ---- getters and decode entries -----------------------------------------------------
    def wrap_getter(self, getter: Callable[..., Any], kernel: Kernel) -> Callable[..., Any]:
        """The getter's kernel comes back wrapped, so a launch inside a prefill call is seen."""
        obs = self
        wrapped: dict[int, tuple[Any, Any]] = {}

        def launch_marker(fn: Callable[..., Any]) -> Callable[..., Any]:
            def launch(*args: Any, **kwargs: Any) -> Any:
                call = getattr(obs._local, "call", None)
                if call is not None and call.launched is None:
                    call.launched = kernel
                return fn(*args, **kwargs)

            return mark(launch, fn)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = getattr(obs._local, "call", None)
            if call is not None:
                call.attempted = kernel  # vLLM is trying this kernel (its getter may also raise)
            fn = getter(*args, **kwargs)
            try:
                if fn is None:
                    if call is not None:
                        call.saw_none.add(kernel)
                        call.attempted = None
                    return None
                hit = wrapped.get(id(fn))
                if hit is None or hit[0] is not fn:
                    hit = wrapped[id(fn)] = (fn, launch_marker(fn))
                return hit[1]
            except Exception as exc:  # noqa: BLE001
                obs.failed("getter", exc)
                return fn

        for name in ("cache_clear", "cache_info", "cache_parameters"):  # functools.cache getters
            if hasattr(getter, name):
                setattr(wrapper, name, getattr(getter, name))
        return mark(wrapper, getter)

    def wrap_decode(self, original: Callable[..., Any], q_index: int) -> Callable[..., Any]:
        """Counts the outermost decode-entry call (a decode variant may call another)."""
        obs = self
        local = self._local
        compiling = is_compiling()

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return original(*args, **kwargs)
            depth = getattr(local, "decode_depth", 0)
            if depth == 0:
                try:
                    q = args[q_index] if q_index < len(args) else kwargs.get("q")
                    if obs.ready(q):
                        obs.decode_calls += 1
                        obs.telemetry.record_decode_path(int(q.shape[0]), obs.model.get())
                except Exception as exc:  # noqa: BLE001
                    obs.failed("decode", exc)
            local.decode_depth = depth + 1
            try:
                return original(*args, **kwargs)
            finally:
                local.decode_depth = depth

        return mark(wrapper, original)
