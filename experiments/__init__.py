"""Routing experiments on live traffic: arm B (one of advise's candidates) measured against arm A (the active policy).

Imports dispatcher's types, advise's candidates and tables, telemetry's buckets and stamp tables; the dispatcher
never imports it (it sees an experiment only through ``dispatcher.arms.ArmChooser``). Modules: ``config`` (the
pydantic settings), ``assignment`` (pure: (seed, position) -> arm), ``candidates`` (arm B's kernel, eligibility,
never-moved reasons, the start-time refusal), ``stats`` (pure: moments, the anytime-valid band, CUPED, saving,
crossover, the clock's bound in the band, thin buckets' calls needed), ``clock`` and ``calibration`` (timing with no
sync, the gated pair's offset taken out, each clock's residual bound), ``numerics`` (output checks with no sync), ``runtime`` (one experiment in one
process), ``report`` (merge across processes, the view), ``control`` (start/stop/read on a target), ``covariate``
(advise's tables as the CUPED covariate and the prediction). docs/experiments.md explains the statistics and rules.

Control API (the service and the CLI build on it; a target is a ``Registry`` or a multiprocess directory path)::

    start(target, config: ExperimentConfig) -> dict        # the experiment's view; ExperimentError if refused
    stop(target, id, reason="user") -> dict                  # idempotent
    acknowledge(target, id, by="user") -> dict               # a person read a stop (the alert resolves); idempotent
    experiments(target) -> list[dict]                        # the GET /experiments items, merged across processes

Each item: ``id, candidate, fraction, state`` (running | stopped | finished), ``stop_reason`` (None unless stopped:
harm, budget, numerics, b_raised, user, or the reason given), ``cells`` ([{model, rows_bucket, kernel_a, kernel_b,
calls_a, calls_b, timed_a, timed_b, ratio, ratio_low, ratio_high (the statistical band widened by the clocks'
bounds), ratio_low_stat, ratio_high_stat (the statistical band alone), clock_bound_s ({a, b}: seconds), shape,
call_class, cuped, mean_a_s, mean_b_s,
prediction: {ratio, ratio_low, ratio_high, reason, tables, notes}: advise's, with its band, numerics: {checked,
mismatched}}]), ``saving`` ({seconds, low, high}: what B would have
saved over the eligible calls seen; positive is faster), ``history`` ([{t, cells: [{model, rows_bucket, shape,
call_class, calls_a, calls_b, timed_a, timed_b, ratio, ratio_low, ratio_high}]}], at most 60 flushes), ``crossover``
({rows, rule, decided, undecided: None or {rows_bucket, calls, calls_needed, needed_because}}: judged on ``buckets``),
``buckets`` ([{rows_bucket, lo, hi, calls, cells, covered, ratio, ratio_low, ratio_high, ratio_low_stat,
ratio_high_stat, pairs, verdict (no_worse | worse | undecided), calls_needed, needed_because}]: the moved cells of
each rows bucket pooled across models, shapes and call classes), ``end_reason``
(max_calls | max_seconds when finished), ``never_moved`` ({reason: calls}: capture, candidate_unavailable,
guard_refusal, batch_invariant, decode_on_prefill, not_running), ``ineligible``, ``b_failures``, ``last_error``,
``clock_dropped``, ``budget`` ({extra_s, eligible_s, share, window_s}), ``acknowledged`` ({at, by} once a
person acknowledged a stop, else None), ``processes``, ``started_at``,
``ended_at``, ``elapsed_s``, ``alpha``, ``config``.

``ExperimentConfig`` fields: id, candidate (gfx942_N | gfx950_N | split_below_N | decodes_split_k | aa), fraction
(0.01, at most 0.1), seed, harm_bound (0.05), budget (0.005), window_s (3600), numerics_every (64), max_calls,
max_seconds, allow_decode_on_prefill (False), cells (aa only: [{model, rows_bucket}]), min_samples (30), clock
(gated | stamp), tolerance (None: the sweep's bound by dtype).

Attaching to a Dispatcher (the demo)::

    registry = Registry(dispatcher.platform, dispatcher.policy, torch_mod=torch,
                        predictor=predictor_for(dispatcher.platform),
                        directory=None,  # or the multiprocess directory: its experiments are picked up at flush
                        batch_invariant=os.environ.get("VLLM_BATCH_INVARIANT") == "1")
    registry.attach(dispatcher)          # the running experiment becomes the dispatcher's arm chooser
    registry.start_flusher(1.0)          # statistics and stops off the call path; registry.close() at the end
    start(registry, ExperimentConfig(id="e1", candidate="split_below_64", fraction=0.05))

Per routed call outside the Dispatcher (the vLLM plugin), with ``experiment = registry.current`` while
``experiment.running``; the Dispatcher does exactly this in ``dispatcher.arms.run_arm``::

    arm = experiment.choose(decision_a, shape, batch, model, q, position=(step, call_in_step))
    # None: run A, nothing else to do. Otherwise arm.decision.kernel is what to run (B's kernel when arm.is_b);
    # never-moved calls (capture, guard, batch-invariant, decode onto prefill) already came back as None.
    stamp = experiment.begin(arm, q, stream)     # before the timed launch (a DeviceStamp or None)
    # arm.check (a numerics sample): run A into output, then B into scratch = torch.empty_like(output),
    #     then experiment.finish(arm, Outcome.CHECKED, None, output, scratch)
    # else run arm.decision.kernel into output, then experiment.finish(arm, Outcome.RAN)
    # B raised: experiment.finish(arm, Outcome.FAILED, exc), run A into output, return normally
    # B's kernel cannot run here: experiment.finish(arm, Outcome.UNAVAILABLE), run A
"""

from dispatcher.arms import Arm, ArmChooser, Outcome

from .candidates import NotMoved, StartRefused
from .config import CellName, ExperimentConfig
from .control import ExperimentError, NotStopped, Registry, acknowledge, experiments, start, stop
from .covariate import Predictor, predictor_for
from .runtime import Experiment

__all__ = [
    "Arm", "ArmChooser", "CellName", "Experiment", "ExperimentConfig", "ExperimentError", "NotMoved", "NotStopped",
    "Outcome", "Predictor", "Registry", "StartRefused", "acknowledge", "experiments", "predictor_for", "start", "stop",
]
