#!/usr/bin/env bash
# What the figures of docs/benchmarks.md ("Host cost of a call", "Timing fidelity", "Telemetry on the GPU", "CUDA
# graphs", "What a gate change saves", "The demo on a GPU") rest on, on the GPU, in one command; each phase under a
# time limit, its output in $OUT.
#   bash scripts/gpu/h200_check.sh [phase ...]
#   phases: host fidelity reroute reroute-d512 foreign foreign-reroute foreign-graphs quantiles replay replay-reroute
#   foreign-replay graphs tests graph-tests foreign-tests launch split split-ab redo-ab kernels ab demo
# The GPU test suite is three device calls, each a group that fits one 600 s call with its compiles on a fresh machine
# (no .tcache carried): `suite-1` (the kernels against the reference: compile-bound, so pytest-xdist runs 8 workers),
# `suite-2` (launch paths, split-K reduce, NaN), `suite-3` (telemetry on the GPU, eager and graph clocks:
# timing-sensitive, run alone).
# A group name runs its phases: bash scripts/gpu/h200_check.sh suite-1
# `pools` (docs/advise.md, "The kv pool"): the sweep's defaults (every power of two 1-16,384 rows, three kv pools)
# after a parallel compile of their kernels, live back-to-back ratios against that table, and the A/B replay at
# advise's gate for an L2 and an HBM pool. Set ROUTESCOPE_COMMIT to the commit the tree was copied from.
# Run from the repository root on the device machine (the `run` tool, carry [".whl", ".tcache"]). The wheels the
# image lacks are installed first (docs/benchmarks.md, "Machines and setup"); Triton's cache lives in .tcache and
# comes back as $OUT/tcache.tgz, so carrying it spares the next run the compiles.
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT" .tcache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.tcache
[ -f .tcache/tcache.tgz ] && tar -xzf .tcache/tcache.tgz -C .tcache && rm .tcache/tcache.tgz
RS=(python3 -c "import sys; from routescope.cli import main; sys.argv[0] = 'routescope'; main()")  # `routescope`
phase() {  # name, seconds, command...: stdout to $OUT/results.txt, stderr to $OUT/log.txt (few files come back)
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date +%T))" | tee -a "$OUT/log.txt"
  echo "=== $name" >> "$OUT/results.txt"
  timeout -k 15 "$limit" "$@" >> "$OUT/results.txt" 2>> "$OUT/log.txt"; echo "   rc=$? ($(date +%T))" | tee -a "$OUT/log.txt"
}
phases=${*:-host fidelity reroute reroute-d512 replay replay-reroute graphs tests launch split split-ab redo-ab kernels ab demo}
phases=${phases//suite-1/kernels}
phases=${phases//suite-2/launch split nan}
phases=${phases//suite-3/tests graph-tests}
phases=${phases//pools/warm pool-sweep pool-live pool-ab}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "commit: ${ROUTESCOPE_COMMIT:-not given (ROUTESCOPE_COMMIT)}"  # a copy of the tree: no .git of its own
for p in $phases; do
  case $p in
    host) phase host 120 "${RS[@]}" bench host --json ;;
    fidelity) phase fidelity 240 "${RS[@]}" bench fidelity --json ;;
    reroute) phase reroute 120 "${RS[@]}" bench fidelity --guard reroute --rows 1,2,16,256,1024 --json ;;
    reroute-d512) phase reroute-d512 120 "${RS[@]}" bench fidelity --guard reroute --rows 1,2,16 --layout 512+0 --json ;;
    foreign) phase foreign 420 "${RS[@]}" bench fidelity --no-stamps --json ;;
    foreign-graphs) phase foreign-graphs 300 "${RS[@]}" bench fidelity --no-stamps --graphs --json ;;
    foreign-reroute) phase foreign-reroute 240 "${RS[@]}" bench fidelity --no-stamps --guard reroute \
                       --rows 1,2,16 --json ;;
    foreign-replay) phase foreign-replay 300 python3 -m telemetry.bench.gpu_replay --no-stamps \
                      --out "$OUT/replay-foreign.json" --guard observe ;;
    quantiles) phase quantiles 300 "${RS[@]}" bench quantiles --device cuda --json ;;
    foreign-tests) phase foreign-tests 360 python3 -m pytest -q -m gpu -p no:cacheprovider \
                     tests/telemetry/test_gpu_real.py -k "write_no_stamps" ;;
    replay) phase replay 300 python3 -m telemetry.bench.gpu_replay --out "$OUT/replay-observe.json" --guard observe ;;
    replay-reroute) phase replay-reroute 300 python3 -m telemetry.bench.gpu_replay --out "$OUT/replay-reroute.json" \
                      --guard reroute ;;
    graphs) phase graphs 120 "${RS[@]}" bench graphs --json ;;
    tests) phase tests 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/telemetry/test_gpu_real.py \
             tests/dispatcher/test_sweep_cupti.py ;;
    graph-tests) phase graph-tests 360 python3 -m pytest -q -m gpu -p no:cacheprovider \
                   tests/telemetry/test_gpu_graph_clock.py tests/vllm_plugin/test_gpu_graph_clock.py ;;
    nan) phase nan 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/dispatcher/kernels/test_nan_propagation.py ;;
    launch) phase launch 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/dispatcher/kernels/test_launch_gpu.py ;;
    split) phase split 240 python3 -m pytest -q -m gpu -p no:cacheprovider \
             tests/dispatcher/kernels/test_split_reduce_gpu.py ;;
    split-ab) phase split-ab 300 python3 scripts/gpu/decode_ab.py ;;
    redo-ab) phase redo-ab 300 python3 scripts/gpu/prefill_redo_ab.py ;;
    kernels) phase kernels 540 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 --durations=8 \
               tests/dispatcher/kernels/test_triton_gpu.py ;;
    ab) phase ab 300 python3 -m advise.ab_cli --calls 600 --repeats 3 --json ;;
    warm) phase warm 120 python3 scripts/gpu/warm.py --procs 16 ;;
    pool-sweep) phase pool-sweep 270 "${RS[@]}" sweep --timer cupti --out "$OUT/sweep" ;;
    pool-live) phase pool-live 90 python3 -m advise.live --table "$OUT/sweep/sweep.json" --kv-pool 8MiB,256MiB,4GiB \
                 --out "$OUT/live.json" ;;
    pool-ab) for slots in 8192 262144; do
               phase "pool-ab-$slots" 50 python3 -m advise.ab_cli --calls 600 --repeats 3 --table "$OUT/sweep/sweep.json" \
                 --kv-pool "$slots" --json --out "$OUT/ab-$slots.json"
             done ;;
    demo) phase demo 150 python3 scripts/gpu/demo_check.py --seconds 25 --out "$OUT/demo" ;;
    *) echo "unknown phase $p" >&2 ;;
  esac
done
tar -czf "$OUT/tcache.tgz" -C .tcache . 2>/dev/null
[ "$(stat -c %s "$OUT/tcache.tgz")" -gt 15000000 ] && rm -f "$OUT/tcache.tgz"
ls -la "$OUT"
