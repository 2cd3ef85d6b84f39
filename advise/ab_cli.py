"""`routescope bench ab`: advise's predicted saving of a gate against the saving an A/B replay measures."""

from __future__ import annotations

import json
import math
from datetime import date
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from dispatcher.outputs import OutputPathError, check_file, write_or_keep
from dispatcher.policy import Policy

from .ab import Arm, Operands, device_target, launchers, measure, replay_traffic, route, sample_cycle, shapes_for
from .policies import DEFAULT_GATES
from .report import TIE, AdviceOut, advise, fmt_seconds
from .tables import LatencyTable, TableError, load_table, table_from_sweep


GPU_MAX_ROWS = 16384  # every call of the demo's cycle
CPU_MAX_ROWS = 256  # a CPU replay in seconds: at 16,384 rows its 800 calls take minutes a pass


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"routescope bench ab: {message}", err=True)
    return typer.Exit(code)


def fresh_table(device, shapes, max_rows: int, kv_pool: int, repeats: int) -> LatencyTable:
    """A sweep run now at the replay's shapes and pool: both kernels at every power of two up to ``max_rows``."""
    from dispatcher.sweep.grid import KernelSpec, Layout
    from dispatcher.sweep.report import device_name
    from dispatcher.sweep.runner import SweepPlan, run_sweep
    from dispatcher.types import Kernel

    rows = tuple(1 << i for i in range(max(1, math.ceil(math.log2(max(2, max_rows)))) + 1))
    heads = {s.heads for s in shapes.values()}
    topks = {s.topk for s in shapes.values()}
    if len(heads) != 1 or len(topks) != 1:
        raise ValueError("the replay's models differ in heads or top-k; one fresh sweep cannot time them")
    plan = SweepPlan(
        kernels=(KernelSpec(Kernel.INTREE_RAGGED_PREFILL), KernelSpec(Kernel.INTREE_SPARSE_DECODE)), rows=rows,
        topk=tuple(topks), layouts=tuple(Layout(s.nope_head_dim, s.rope_head_dim) for s in shapes.values()),
        device=device, heads=heads.pop(), repeats=repeats, warmup=1, kv_len=kv_pool,
        timer="cupti" if device.type == "cuda" else "events",
    )
    results = run_sweep(plan)
    doc = {"device": device_name(device), "command": "routescope bench ab (its fresh sweep)",
           "results": [r._asdict() for r in results]}
    return table_from_sweep(doc, "fresh sweep", date=date.today().isoformat())


def pick_gate(outs: list[AdviceOut], names: list[str]) -> tuple[int | None, str]:
    """(arm B's gate, why it): the scanned gate with the largest predicted saving summed over models, on the first
    table that prices a gate for every model. Among gates that save as much (within report.TIE), the largest some
    model's advice names as its best (advise breaks such ties toward the kernels' crossing), else the smallest. Where
    no gate is predicted to save, the one predicted to lose the least: the replay then checks a predicted loss
    (None: no table prices a gate, and why)."""
    for out, name in zip(outs, names):
        priced: dict[int, list[float]] = {}
        for m in out.models:
            for c in m.candidates:
                if c.kind == "gate" and c.saving is not None and c.gate is not None:
                    priced.setdefault(c.gate, []).append(c.saving.mid)
        totals = {g: sum(v) for g, v in priced.items() if len(v) == len(out.models)}  # a sum needs every model's
        if not totals:
            continue
        best = max(totals.values())
        tied = sorted(g for g, v in totals.items() if abs(v - best) <= TIE * abs(best))
        if best <= 0:
            gate = tied[0]
            return gate, (f"no scanned gate is predicted to save on table {name}; gate {gate} is predicted to lose "
                          f"the least ({fmt_seconds(-best)}), replayed to check that prediction")
        named = {c.gate for m in out.models for c in m.candidates if c.name == m.best and c.gate in tied}
        gate = max(named) if named else tied[0]
        return gate, f"advise's best on table {name}"
    why = "; ".join(f"{name}: {_first_unknown(out)}" for out, name in zip(outs, names))
    return None, f"no table prices a scanned gate on this replay ({why}); give one with --gate, or --table fresh"


def _first_unknown(out: AdviceOut) -> str:
    """Why a table prices no gate on this replay: its first model's reason for its first gate."""
    gates = [c.name for m in out.models for c in m.candidates if c.kind == "gate"]
    return next(iter(_unknown_why(out, gates[0]).values()), "no reason given") if gates else "no gate scanned"


def _predicted(out: AdviceOut, name: str) -> dict[str, dict | None]:
    got = {}
    for m in out.models:
        c = next((c for c in m.candidates if c.name == name), None)
        got[m.model] = None if c is None or c.saving is None else c.saving.model_dump()
    return got


def _unknown_why(out: AdviceOut, name: str) -> dict[str, str]:
    """Why a model's predicted saving is unknown, for each model whose is (advise's own words)."""
    why = {}
    for m in out.models:
        c = next((c for c in m.candidates if c.name == name), None)
        if c is None:
            why[m.model] = f"advise did not scan {name}"
        elif c.saving is None:
            why[m.model] = (c.saving_note or "").removeprefix("unknown: ") or (f"{c.uncovered[0].calls} calls unpriced: {c.uncovered[0].reason}"
                                             if c.uncovered else "the table prices none of these calls")
    if out.status != "ok":
        why["all"] = out.message or out.status
    return why


def run_ab(*, calls: int, gate: int | None, tables: list[str], repeats: int, kv_pool: int | None, seed: int,
           device_name: str, max_rows: int | None = None, progress: Callable[[str], None] | None = None) -> dict:
    import torch

    say = progress or (lambda text: None)
    device = torch.device("cuda" if device_name == "cuda" or (device_name == "auto" and torch.cuda.is_available())
                          else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)  # as the CPU demo: one intra-op thread times steadier on a small machine
    shapes = shapes_for(device)
    max_rows = max_rows or (GPU_MAX_ROWS if device.type == "cuda" else CPU_MAX_ROWS)
    specs = [s for s in sample_cycle(seed, calls) if s.rows <= max_rows]
    if not specs:
        raise ValueError("--max-rows leaves no call to replay")
    target = device_target(device)
    if target.gate_field:
        raise ValueError(f"on {target.arch} a gate moves calls to AITER, which this replay does not launch")
    pool = kv_pool or (16384 if device.type == "cuda" else min(s.kv_pool for s in shapes.values()))
    biggest = max(s.rows for s in specs)
    given = {i: load_table(t) for i, t in enumerate(tables) if t != "fresh"}  # a bad table fails before any sweep
    arm_a = Arm("active", Policy())
    traffic = replay_traffic(specs, shapes, arm_a, target, pool)
    gates = DEFAULT_GATES if gate is None else (gate,)
    if gate is None and len(given) == len(tables):  # no fresh sweep: whether a gate can be picked is known now
        picked, why = pick_gate([advise(traffic, [t], gates=gates, source_kind="replay") for t in given.values()],
                                [t.meta.name for t in given.values()])
        if picked is None:
            raise ValueError(why)
    if len(given) < len(tables):
        say(f"a fresh sweep at the replay's shapes and a {pool}-slot pool (rows up to {biggest})")
    loaded = [given[i] if i in given else fresh_table(device, shapes, biggest, pool, 10 if device.type == "cuda" else 3)
              for i in range(len(tables))]
    scans = [advise(traffic, [t], gates=gates, source_kind="replay") for t in loaded]
    if gate is None:
        gate, choice = pick_gate(scans, [t.meta.name for t in loaded])
        if gate is None:
            raise ValueError(choice)
    else:
        choice = "given with --gate"
    say(f"replaying {len(specs)} calls under the active policy and gate {gate}, {repeats} passes each")
    arm_b = Arm(f"split_below_{gate}", Policy(), split_below=gate)
    kernels = {a.name: [route(s, shapes[s.model], a, target) for s in specs] for a in (arm_a, arm_b)}
    ops = {m: Operands(sh, biggest, pool, device, seed) for m, sh in shapes.items()}
    times = measure({n: launchers(specs, k, ops, device) for n, k in kernels.items()}, device, repeats)
    a_calls, b_calls = times[arm_a.name].per_call(), times[arm_b.name].per_call()
    models = {}
    for model in dict.fromkeys(s.model for s in specs):
        idx = [i for i, s in enumerate(specs) if s.model == model]
        moved = [i for i in idx if kernels[arm_a.name][i] != kernels[arm_b.name][i]]
        models[model] = {
            "calls": len(idx), "moved_calls": len(moved),
            "measured_a_s": sum(a_calls[i] for i in idx), "measured_b_s": sum(b_calls[i] for i in idx),
            "measured_saving_s": sum(a_calls[i] - b_calls[i] for i in moved),
            "predicted_saving_s": {t.meta.name: _predicted(out, arm_b.name).get(model) for t, out in zip(loaded, scans)},
            "predicted_unknown": {t.meta.name: why for t, out in zip(loaded, scans)
                                  if (why := _unknown_why(out, arm_b.name).get(model))},
        }
    clock = ("CUPTI kernel time per call (first kernel start to last kernel end), L2 flushed and the GPU held "
             "before each call as the sweep does" if device.type == "cuda" else
             "host clock around torch kernels at the demo's scaled shapes (1/4096 of the per-row work): this "
             "checks the plumbing, not any GPU figure")
    return {
        "device": str(device), "target": target.arch, "clock": clock, "seed": seed, "calls": len(specs),
        "max_rows": max_rows, "repeats": repeats, "kv_pool": pool, "gate": gate, "gate_choice": choice, "arms": {arm_a.name: "every call as the active policy "
        "routes it", arm_b.name: f"prefill-entry calls under {gate} rows to intree.sparse_decode"},
        "tables": [{"name": t.meta.name, "device": t.meta.device, "date": t.meta.date, "provenance": t.meta.provenance,
                    "commit": t.meta.commit, "kv_pools": list(t.meta.pools)} for t in loaded],
        "kv_pool_bytes": {m: pool * (sh.nope_head_dim + sh.rope_head_dim) * 2 for m, sh in shapes.items()},
        "models": models,
        "measured_saving_s": sum(m["measured_saving_s"] for m in models.values()),
        "predicted_saving_s": {t.meta.name: _sum_bands([m["predicted_saving_s"][t.meta.name] for m in models.values()])
                               for t in loaded},
        "predicted_unknown": {t.meta.name: "the sum needs every model's; unknown for "
                              f"{', '.join(m for m, r in models.items() if t.meta.name in r['predicted_unknown'])}"
                              for t in loaded if any(t.meta.name in r["predicted_unknown"] for r in models.values())},
    }


def _sum_bands(bands: list[dict | None]) -> dict | None:
    """Models' saving bands added end to end (the total's band is at most this wide)."""
    if any(b is None for b in bands):
        return None
    return {k: sum(b[k] for b in bands) for k in ("mid", "low", "high")}


def ab_cells(result: dict) -> list[list[str]]:
    """The table's rows as printed: per model, then "all" (its calls, moved calls and arms summed over the models)."""
    rows = []
    for model, r in [*result["models"].items(), ("all", None)]:
        measured = result["measured_saving_s"] if r is None else r["measured_saving_s"]
        preds = [result["predicted_saving_s"][t["name"]] if r is None else r["predicted_saving_s"][t["name"]]
                 for t in result["tables"]]
        unknown = result.get("predicted_unknown", {}) if r is None else r.get("predicted_unknown", {})
        cells = [f"{fmt_seconds(p['mid'])} ({fmt_seconds(p['low'])}…{fmt_seconds(p['high'])})" if p
                 else f"unknown: {unknown.get(t['name'], 'not recorded why')}" for p, t in zip(preds, result["tables"])]
        first = preds[0]
        ratio = (f"{first['mid'] / measured:.2f}" if first and measured else
                 "n/a: no prediction" if not first else "n/a: no time saved or lost")
        r = r or {k: sum(m[k] for m in result["models"].values())
                  for k in ("calls", "moved_calls", "measured_a_s", "measured_b_s")}
        rows.append([model, str(r["calls"]), str(r["moved_calls"]), fmt_seconds(r["measured_a_s"]),
                     fmt_seconds(r["measured_b_s"]), fmt_seconds(measured), *cells, ratio])
    return rows


def render(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 150))
    console.print(f"A/B replay on {result['device']} ({result['target']}): {result['calls']} demo calls "
                  f"(rows <= {result.get('max_rows', '?')}), "
                  f"{result['repeats']} timed passes per arm, gate {result['gate']} rows "
                  f"({result.get('gate_choice', 'not recorded how chosen')}); {result['clock']}")
    table = Table("model", "calls", "moved", "arm A", "arm B", "measured saving", *(
        f"predicted ({t['name']})" for t in result["tables"]), "predicted / measured")
    for row in ab_cells(result):
        table.add_row(*row)
    console.print(table)
    for t in result["tables"]:
        console.print(f"table {t['name']}: {t['device']}, {t['date']}, {t['provenance']}")
    console.print("measured saving: the moved calls' time in arm A minus in arm B (median of the passes per call); "
                  "the calls not moved run the same kernel in both arms, so arm A - arm B differs from it by their "
                  "noise alone; predicted: advise on the same calls aggregated as telemetry would (rows buckets, "
                  "mean rows)")


def ab_command(
    calls: Annotated[int, typer.Option(min=2, help="prefill-entry calls, spread over one cycle of the demo traffic")] = 1000,
    gate: Annotated[Optional[int], typer.Option(min=1, help="arm B's gate in rows (default: advise's best)")] = None,
    table: Annotated[Optional[list[str]], typer.Option(help="h200, gfx942, a sweep JSON, or fresh (repeatable)")] = None,
    repeats: Annotated[int, typer.Option(min=1, max=50, help="timed passes per arm")] = 3,
    kv_pool: Annotated[Optional[int], typer.Option(min=64, help="kv slots (default 16384 on a GPU: 16 MiB at D = 512, "
                                                                "inside an H200's L2); advise prices at that pool")] = None,
    max_rows: Annotated[Optional[int], typer.Option(
        min=1, help=f"leave out calls of more rows (default {GPU_MAX_ROWS} on a GPU, {CPU_MAX_ROWS} on a CPU, where "
                    "the torch kernels take tens of ms a call at thousands of rows)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the demo traffic")] = 7,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    out: Annotated[Optional[str], typer.Option(help="also write the JSON to this file")] = None,
) -> None:
    """Replay the demo's traffic under the active gate and the advised one; predicted against measured saving."""
    import torch

    if device not in ("auto", "cpu", "cuda"):
        raise _fail(f"--device must be auto, cpu or cuda; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise _fail("--device cuda: no CUDA device is visible to torch")
    if out:
        try:
            check_file(out, "--out")
        except OutputPathError as exc:
            raise _fail(str(exc)) from None
    gpu = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    tables = table or (["h200", "fresh"] if gpu else ["fresh"])
    try:
        result = run_ab(calls=calls, gate=gate, tables=tables, repeats=repeats, kv_pool=kv_pool, seed=seed,
                        device_name=device, max_rows=max_rows,
                        progress=lambda text: typer.echo(f"bench ab: {text}", err=True))
    except TableError as exc:
        raise _fail(f"--table: {exc}") from None
    except ValueError as exc:
        raise _fail(str(exc)) from None
    failed = None
    if out:
        _, failed = write_or_keep(Path(out), json.dumps(result, indent=2), "--out")
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        render(result)
    if failed:
        raise _fail(failed, 1)


if __name__ == "__main__":  # python3 -m advise.ab_cli, where the console script is not installed (a GPU machine)
    typer.run(ab_command)
