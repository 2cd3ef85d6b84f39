"""The second hook the dispatcher owns: an arm chooser that may replace a call's decision (a live experiment).

``dispatcher.probe.Probe`` only watches. An ``ArmChooser`` may send one call to another kernel (arm B) and asks for
some calls to be timed by its own clock, so it has its own contract, enforced here and nowhere else:

- ``choose`` runs once per routed call while a chooser is attached (``Dispatcher.set_arms``); a chooser that raises
  leaves the call on the active arm (A) and is counted in ``Dispatcher.arm_failures``.
- A call assigned to B runs B's kernel. On a numerics sample it runs A into the caller's output and B into scratch,
  and the chooser compares the two: the caller gets A's output.
- A B launch that raises is run again on A, and the call succeeds; the chooser is told (``Outcome.FAILED``).
- A B kernel with no implementation on the call's device, or an AITER symbol that is missing, leaves the call on A
  (``Outcome.UNAVAILABLE``).
- ``begin`` and ``finish`` run on the launch path, never synchronise the device, and a failure in either is counted
  and ignored: the call's result never depends on them.

With no chooser attached the dispatcher pays one attribute check per call (docs/experiments.md has the figures).
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .kernels.aiter import AiterSymbolMissing
from .kernels.registry import NoImplementation
from .policy import _ORDINALS
from .types import Batch, CallShape, Decision, Kernel

if TYPE_CHECKING:
    import torch

    from .kernels.common import KernelArgs
    from .kernels.impl import KernelImpl

ARM_B_REASON = "experiment_b"  # the reason_code of every call run on arm B: telemetry's label for the arm


class Outcome(str, Enum):
    """How a chosen call ended, as ``ArmChooser.finish`` is told."""

    RAN = "ran"  # the arm ran as chosen (B's kernel for a B call, A's for a timed A call)
    CHECKED = "checked"  # numerics sample: A ran into the output, B into scratch (``expected``/``got`` given)
    FAILED = "failed"  # B's launch raised; the call was run again on A and succeeded
    UNAVAILABLE = "unavailable"  # B's kernel cannot run here (no implementation, AITER symbol missing); A ran
    ERROR = "error"  # A itself raised (the exception goes on to the caller, as without an experiment)

    def __str__(self) -> str:
        return self.value


class Arm:
    """One chosen call: the decision that runs, whether it is B, whether the chooser times it or checks numerics.

    ``decision`` is arm B's (kernel B, reason code ``experiment_b``) for a B call and A's own for a timed A call.
    ``ticket`` is the chooser's own state for the call (its cell, its clock); the dispatcher never reads it.
    """

    __slots__ = ("decision", "is_b", "timed", "check", "ticket")

    def __init__(self, decision: Decision, *, is_b: bool, timed: bool = True, check: bool = False,
                 ticket: Any = None) -> None:
        self.decision = decision
        self.is_b = is_b
        self.timed = timed
        self.check = check and is_b
        self.ticket = ticket


@runtime_checkable
class ArmChooser(Protocol):
    """What an experiment implements (``experiments.runtime.Experiment`` is the one the project ships)."""

    def choose(self, decision: Decision, shape: CallShape, batch: Batch, model: str | None, q: torch.Tensor,
               position: Any = None) -> Arm | None:
        """Once per routed call, after the active decision, before any launch; None leaves the call alone (A,
        untimed), the common case, so it must be cheap. ``position`` is the call's place in its step where the
        caller knows it (the vLLM plugin); the Dispatcher passes None and the chooser counts calls itself."""
        ...

    def begin(self, arm: Arm, q: torch.Tensor, stream: Any | None) -> Any:
        """Right before the timed launch (B's, or a timed A call's); returns a ``kernels.stamps.DeviceStamp`` for
        the launch to write, or None. A stamp returned here replaces the probe's for this call."""
        ...

    def finish(self, arm: Arm, outcome: Outcome, error: BaseException | None = None,
               expected: torch.Tensor | None = None, got: torch.Tensor | None = None) -> None:
        """Exactly once per chosen call, right after its launches returned (or failed); ``expected`` and ``got``
        are A's output and B's scratch on a numerics sample (compare without a sync)."""
        ...


def arm_decision(active: Decision, kernel: Kernel, why: str) -> Decision:
    """Arm B's decision for calls the active ``decision`` routes elsewhere: memoisable, labelled ``experiment_b``."""
    # no rerouted_from: that marks the guard's reroutes, which telemetry exports as routescope_guard_rerouted_*
    decision = Decision(kernel, f"experiment arm B: {why}", ARM_B_REASON, active.gates, "experiment",
                        active.call_class)
    object.__setattr__(decision, "ordinal", next(_ORDINALS))  # fresh, not yet shared: safe to set
    return decision


def _finish(dispatcher: Any, chooser: ArmChooser, arm: Arm, outcome: Outcome,
            error: BaseException | None = None, expected: Any = None, got: Any = None) -> None:
    try:
        chooser.finish(arm, outcome, error, expected, got)
    except Exception:  # noqa: BLE001
        dispatcher.arm_failures += 1


def _begin(dispatcher: Any, chooser: ArmChooser, arm: Arm, args: KernelArgs, stream: Any) -> KernelArgs:
    if not arm.timed:
        return args
    try:
        stamp = chooser.begin(arm, args.q, stream)
    except Exception:  # noqa: BLE001
        dispatcher.arm_failures += 1
        return args
    if stamp is None:
        return args
    q, kv, index, scale, sink, output, _, memo = args  # KernelArgs(...) is cheaper than NamedTuple._replace
    return args.__class__(q, kv, index, scale, sink, output, stamp, memo)


def run_arm(dispatcher: Any, chooser: ArmChooser, arm: Arm, active: Decision, impl_a: KernelImpl,
            shape: CallShape, batch: Batch, model: str | None, stream: Any, args: KernelArgs) -> Decision:
    """Launch one chosen call under the contract above; returns the decision whose kernel wrote the output."""
    impl_b = None
    if arm.is_b:
        try:
            impl_b = dispatcher.registry.resolve(arm.decision.kernel, "cuda" if args.q.is_cuda else args.q.device.type)
        except NoImplementation:
            _finish(dispatcher, chooser, arm, Outcome.UNAVAILABLE)
            return _observed(dispatcher, active, impl_a, shape, batch, model, stream, args)
    if impl_b is None or arm.check:
        # a timed A call, or a numerics sample: A writes the caller's output (a sample times B, into scratch)
        timed_a = impl_b is None
        try:
            ran = _observed(dispatcher, active, impl_a, shape, batch, model, stream,
                            _begin(dispatcher, chooser, arm, args, stream) if timed_a else args)
        except BaseException as exc:
            _finish(dispatcher, chooser, arm, Outcome.ERROR, exc)
            raise
        if timed_a:
            _finish(dispatcher, chooser, arm, Outcome.RAN)
            return ran
        import torch

        scratch = torch.empty_like(args.output)
        try:
            impl_b.launch(_begin(dispatcher, chooser, arm, args._replace(output=scratch, memo=None), stream))
        except Exception as exc:  # noqa: BLE001 - B failed on a sample: the caller already has A's output
            _finish(dispatcher, chooser, arm, Outcome.UNAVAILABLE if isinstance(exc, AiterSymbolMissing)
                    else Outcome.FAILED, exc)
            return ran
        _finish(dispatcher, chooser, arm, Outcome.CHECKED, None, args.output, scratch)
        return ran
    try:
        ran = _observed(dispatcher, arm.decision, impl_b, shape, batch, model, stream,
                        _begin(dispatcher, chooser, arm, args, stream), b_launch=True)
    except _BFailed as failed:
        exc = failed.__cause__
        _finish(dispatcher, chooser, arm, Outcome.UNAVAILABLE if isinstance(exc, AiterSymbolMissing)
                else Outcome.FAILED, exc)
        return _observed(dispatcher, active, impl_a, shape, batch, model, stream, args._replace(stamp=None))
    _finish(dispatcher, chooser, arm, Outcome.RAN)
    return ran


class _BFailed(Exception):
    """B's launch raised (the cause): the call is run again on A."""


def _observed(dispatcher: Any, decision: Decision, impl: KernelImpl, shape: CallShape, batch: Batch,
              model: str | None, stream: Any, args: KernelArgs, *, b_launch: bool = False) -> Decision:
    """One launch of ``impl`` for ``decision``, watched by the probe as ``Dispatcher.__call__`` watches its own."""
    probe = dispatcher.probe
    announced = impl.impl
    token = None
    recorded = False
    if probe is not None:
        try:
            token = probe.start(decision, shape, batch, model, args.q, stream, announced)
        except Exception:  # noqa: BLE001
            dispatcher.probe_failures += 1
            probe = None
        recorded = token.__class__ is int
        if not recorded and token is not None and args.stamp is None:
            stamp = getattr(token, "stamp", None)
            if stamp is not None:
                args = args._replace(stamp=stamp)
    try:
        try:
            ran = impl.launch(args) or announced
        except AiterSymbolMissing:
            if b_launch or decision.kernel is not Kernel.AITER_OPUS:
                raise
            decision, ran = dispatcher._opus_declined(shape, batch, args)
    except BaseException as exc:
        if probe is not None:
            try:
                probe.error(token, exc, announced, announced)
            except Exception:  # noqa: BLE001
                dispatcher.probe_failures += 1
        if b_launch and isinstance(exc, Exception):
            raise _BFailed() from exc
        raise
    if probe is not None and (not recorded or ran is not announced):
        try:
            probe.stop(token, ran, announced)
        except Exception:  # noqa: BLE001
            dispatcher.probe_failures += 1
    return decision
