python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc W=/tmp/w
mkdir -p $W; git log --oneline -1 > $W/log.txt; nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $W/log.txt
OUT=$W/ab timeout 170 python3 scripts/gpu/ablate_probe.py --ablate 0 --repeats 20 --layouts 512+64,448+64,512+0 --beside-d512 >> $W/log.txt 2>&1
python3 -m dispatcher.sweep --kernels intree.ragged_prefill,intree.sparse_decode --rows 2,16,16384 --topk 2048 --layout 512+64,448+64,512+0 --timer cupti --out $W/targets > $W/targets.log 2>&1
python3 -m dispatcher.sweep --layout 448+64,512+0,512+64 --device cuda --out $W/sweep > $W/sweep.log 2>&1
python3 -m dispatcher.sweep --timer cupti --layout 448+64,512+0,512+64 --device cuda --out $W/sweep-cupti > $W/sweep-cupti.log 2>&1
tar czf $OUT/s30b.tgz -C $W .
timeout 250 python3 -m pytest -m gpu -p no:cacheprovider -k "computes_again or (sm90_full_shapes and (default or ws-decode)) or registry_runs_gluon or fp8_pools_match_the_reference_through_the_registry" tests/dispatcher/kernels/test_triton_gpu.py -rA -v > $W/pytest.log 2>&1
tar czf $OUT/s30b.tgz -C $W .
grep -E "ablate|checks" $W/log.txt; tail -4 $W/targets.log; grep -E "PASS|FAIL|ERROR|passed|failed" $W/pytest.log | tail -25
