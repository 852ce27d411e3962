#!/usr/bin/env bash
# The whole GPU check in one run (at most ~10 minutes of step budgets on one H200; ~8 expected): `make test-cuda`, then each `make bench-cuda` part
# under its own timeout. Every log and report is copied to $OUT as soon as it exists, so a part that is killed
# loses nothing of the others. Uses the machine's own python3 (PY=... to change it); no venv needed.
#   OUT=/tmp/gpu bash bench/gpu_check.sh
set -u
OUT=${OUT:-bench/gpu_out}
PY=${PY:-python3}
mkdir -p "$OUT" bench/results
collect() { cp bench/results/*cuda* "$OUT"/ 2>/dev/null || true; }
step() {
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc ${SECONDS}s-total $((SECONDS - start))s" | tee -a "$OUT/steps.txt"
  collect
}
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" > "$OUT/torch.txt" 2>&1
step test-cuda 80 $PY -m pytest -q -m cuda -rs tests/core
step decode_counts 30 $PY -m lantern_core.benchmarks.decode_counts --device cuda --dtype bfloat16 --no-inductor --out bench/results
step ar 170 $PY -m lantern_core.benchmarks.ar --device cuda --dtype bfloat16 --out bench/results
step iteration_cost 110 $PY -m lantern_core.benchmarks.iteration_cost --device cuda --dtype bfloat16 --model GPT-XL --iterations 0 --out bench/results
step speculative 55 $PY -m lantern_core.benchmarks.speculative --device cuda --dtype bfloat16 --images 8 --out bench/results
step batched 55 $PY -m lantern_core.benchmarks.batched --device cuda --dtype bfloat16 --images 8 --out bench/results
step families 40 $PY -m lantern_core.benchmarks.families --device cuda --dtype bfloat16 --images 1 --out bench/results
step prefix_states 25 $PY -m lantern_core.benchmarks.prefix_states --device cuda --dtype bfloat16 --model GPT-XL --repeats 2 --out bench/results
step decode 20 $PY -m lantern_core.benchmarks.decode --device cuda --dtype bfloat16 --repeats 3 --out bench/results
step quantization 150 $PY -m lantern_core.benchmarks.quantization_gpu --device cuda --model 7B --batches 1 4 --compile graphs --out bench/results
