"""``sparse_attn_prefill``: validate, decide, launch, and let a probe watch. vLLM's signature."""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any

import torch

from .arms import ArmChooser, run_arm
from .classify import CountsCache
from .kernels.aiter import AiterSymbolMissing
from .kernels.common import KernelArgs, SparseIndex
from .kernels.registry import KernelRegistry, default_registry
from .platform import Platform, detect
from .policy import DecisionCache, Policy, PolicySettings
from .probe import Probe
from .types import Batch, CallShape, Decision, Kernel
from .signature import ValidatedCalls


class DecodeInPrefillError(RuntimeError):
    """Raised in guard mode ``raise`` when a pure-decode batch reaches a prefill kernel."""

    def __init__(self, decision: Decision, shape: CallShape, batch: Batch, model: str | None) -> None:
        super().__init__(
            f"pure-decode batch ({batch.decode_rows} decode rows in {batch.requests} requests, "
            f"q rows {shape.rows}, model {model or 'unknown'}) reached {decision.kernel}, a prefill "
            "kernel with no split-K; route decodes to the decode path (guard mode 'raise')"
        )
        self.decision = decision


class Dispatcher:
    """Routes sparse MLA prefill calls for one platform and policy; cheap to call, built by hand."""

    def __init__(
        self,
        *,
        platform: Platform | None = None,
        policy: Policy | None = None,
        registry: KernelRegistry | None = None,
        probe: Probe | None = None,
    ) -> None:
        self.platform = platform if platform is not None else detect()
        self.policy = policy if policy is not None else PolicySettings().policy()
        self.registry = registry if registry is not None else default_registry()
        self.probe = probe
        self.probe_failures = 0
        self.arms: ArmChooser | None = None  # an experiment's arm chooser (dispatcher/arms.py); None: none runs
        self.arm_failures = 0
        self._cache = DecisionCache(self.platform, self.policy)
        self._validated = ValidatedCalls()
        self._classify = CountsCache()

    def set_probe(self, probe: Probe | None) -> None:
        self.probe = probe

    def set_arms(self, chooser: ArmChooser | None) -> None:
        """Attach an experiment's arm chooser (None detaches it); its contract is dispatcher/arms.py's."""
        self.arms = chooser

    def decide(self, shape: CallShape, batch: Batch) -> Decision:
        return self._cache.decide(shape, batch.call_class)

    def __call__(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        indices: torch.Tensor | None,
        topk_length: torch.Tensor | None,
        scale: float,
        head_dim: int,
        nope_head_dim: int,
        rope_head_dim: int,
        attn_sink: torch.Tensor | None,
        output: torch.Tensor,
        ragged_indices: torch.Tensor | None = None,
        ragged_indptr: torch.Tensor | None = None,
        *,
        query_lens: Any = None,
        num_decodes: int | None = None,
        num_decode_tokens: int | None = None,
        num_prefills: int | None = None,
        model: str | None = None,
        stream: Any = None,
    ) -> Decision:
        shape, memo = self._validated(
            q, kv, indices, topk_length, scale, head_dim, nope_head_dim, rope_head_dim,
            attn_sink, output, ragged_indices, ragged_indptr,
        )
        batch = self._classify(
            rows=shape.rows, query_lens=query_lens, num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens, num_prefills=num_prefills,
            spec_tokens=self.policy.spec_tokens,
        )
        cache, registry = self._cache, self.registry
        # the signature's decision and the implementation that runs it, if this cache made the one and this registry,
        # unchanged since, resolved the other: a call of a known shape decides and resolves for free
        known = memo.get(batch.call_class) if memo is not None else None
        if known is not None and known[0] is cache and known[2] is registry and known[3] == registry.generation:
            decision, impl = known[1], known[4]
        else:
            decision = cache.decide(shape, batch.call_class)
            impl = registry.resolve(decision.kernel, "cuda" if q.is_cuda else q.device.type)
            if memo is not None:
                memo[batch.call_class] = (cache, decision, registry, registry.generation, impl)
        args = KernelArgs(q, kv, SparseIndex(indices, topk_length, ragged_indices, ragged_indptr), float(scale),
                          attn_sink, output, None, memo)
        arms = self.arms
        if arms is not None:
            try:  # dispatcher/arms.py's contract: a chooser that raises leaves the call on A, counted
                arm = arms.choose(decision, shape, batch, model, q)
            except Exception:  # noqa: BLE001
                self.arm_failures += 1
                arm = None
            if arm is not None and not decision.refused:  # a refused call raises below, as without an experiment
                return run_arm(self, arms, arm, decision, impl, shape, batch, model, stream, args)
        announced = impl.impl
        probe = self.probe
        token = None
        recorded = False  # the probe's int token: the call is fully recorded if the announced impl runs
        if probe is not None:
            try:
                token = probe.start(decision, shape, batch, model, q, stream, announced)
            except Exception:  # noqa: BLE001 - an observer never breaks the call
                self.probe_failures += 1
                probe = None
            recorded = token.__class__ is int
            if not recorded and token is not None:  # a sampled call: its kernels may stamp it
                stamp = getattr(token, "stamp", None)
                if stamp is not None:
                    args = args._replace(stamp=stamp)
        try:
            if decision.refused:
                raise DecodeInPrefillError(decision, shape, batch, model)
            try:
                ran = impl.launch(args) or announced
            except AiterSymbolMissing:
                if decision.kernel is not Kernel.AITER_OPUS:
                    raise
                decision, ran = self._opus_declined(shape, batch, args)
        except BaseException as exc:
            if probe is not None:
                try:
                    probe.error(token, exc, announced, announced)
                except Exception:  # noqa: BLE001
                    self.probe_failures += 1
            raise
        if probe is not None and (not recorded or ran is not announced):
            try:
                probe.stop(token, ran, announced)
            except Exception:  # noqa: BLE001
                self.probe_failures += 1
        return decision

    def _opus_declined(self, shape: CallShape, batch: Batch, args: KernelArgs) -> tuple[Decision, str]:
        """gfx950: a missing OPUS symbol declines the branch; decide again without it (a new cache: the signature
        memos' decisions, made by the old one, are not used again) and launch."""
        self.platform = replace(self.platform, opus_importable=False)
        self._cache = DecisionCache(self.platform, self.policy)
        decision = self._cache.decide(shape, batch.call_class)
        impl = self.registry.resolve(decision.kernel, args.q.device.type)
        return decision, impl.launch(args) or impl.impl


def sparse_attn_prefill(*args: Any, dispatcher: Dispatcher | None = None, **kwargs: Any) -> Decision:
    """vLLM's ``rocm_sparse_attn_prefill`` signature (``Dispatcher.__call__``'s); writes ``output``, returns the Decision.

    Without ``dispatcher`` a fresh one is built for this platform and the ROUTESCOPE_* policy;
    long-lived callers should build a :class:`Dispatcher` once and call it.
    """
    return (dispatcher if dispatcher is not None else Dispatcher())(*args, **kwargs)


def _signature() -> inspect.Signature:
    """``Dispatcher.__call__``'s parameters without ``self``, plus ``dispatcher``: one signature, written once."""
    params = list(inspect.signature(Dispatcher.__call__).parameters.values())[1:]
    extra = inspect.Parameter("dispatcher", inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation="Dispatcher | None")
    return inspect.Signature(params + [extra], return_annotation="Decision")


sparse_attn_prefill.__signature__ = _signature()  # type: ignore[attr-defined]
