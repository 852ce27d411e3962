#!/usr/bin/env bash
# The GPU check (one H200). GPU time comes in windows of 15 minutes, start-up included, at most 10 minutes a
# command; the first device call is part 1, the others are optional, each in a later call or window:
#   OUT=$OUT PART=1 bash bench/gpu_check.sh   # at most 7 minutes (420 s): environment, test-cuda (the CUDA half of
#       tests/core/test_graph_lifecycle.py: a session's capture sequences, each comparing captured tokens with eager
#       ones; no Inductor), iteration_cost on GPT-XL (every mode, compile graphs and auto), ar on GPT-XL at batch 1,
#       speculative on the embedded model (4 images), quantization of the 7B shape at batch 1 (fused matmul)
#   OUT=$OUT PART=2 bash bench/gpu_check.sh   # optional (at most 9 minutes): decode_counts, the rest of ar
#       (ar_rest_*), same_seed (the lossless trees' bf16 / float32 tokens against AR's, eager and replayed, with
#       the near-tie flip rate), batched, families, prefix_states, decode, the whole quantization table
#   OUT=$OUT PART=3 bash bench/gpu_check.sh   # optional (at most 9 minutes): test-cuda-rest, every other CUDA test
#       (Inductor-compiled steps, sync checks, reservations: the first GPU run got through 3 of them in 90 s)
# PART=all (the default) runs all three, for local use. Every step runs under `timeout` with a budget its arguments can
# meet (Python start-up and compiles included; part 1's budgets plus KILL_AFTER per step sum to at most 420 s) and
# logs to its own file; every benchmark rewrites its report after each row, so a step that runs out of time keeps
# what it measured. A step FAILS when its log shows a capture or compile fallback (a line with CAPTURE FALLBACK or
# COMPILE FALLBACK, or the older texts "CUDA graph capture failed", "Inductor could not compile", "no captured CUDA
# graph"), even when it exits 0: its summary line ends with the count, e.g. "(3 fallbacks)".
# After every step the part's logs, the reports it wrote and its summary are packed into ONE archive,
# $OUT/gpu_check_part<N>.tar.gz (overwritten), and $OUT/summary_part<N>.txt gets the step's line: at most 4 files
# in $OUT. The end prints a one-screen summary; the exit status is 1 if any step failed or timed out (a failing
# step never stops the others). Uses the machine's python3 (PY=... to change it; torch 2.11 or later, no venv);
# reports go to RESULTS (default bench/results).
#   GPU_CHECK_DRY=1: the same steps on the CPU with tiny shapes (every step's code path, the same report files and
#     archives; reports into a scratch folder unless RESULTS is set); `make test` runs it
#     (tests/core/test_gpu_check_dry.py). The GPU budgets are not wall-clock limits there: a dry step gets
#     GPU_CHECK_DRY_BUDGET seconds (default 1800), since a loaded 2-core machine is no GPU.
#   GPU_CHECK_MAX_BUDGET=s: no step gets more than s seconds (a quick look; the tests use it).
set -u

PART=${PART:-all}
PY=${PY:-python3}
OUT=${OUT:-bench/gpu_out}
DRY=${GPU_CHECK_DRY:-0}
DRY_BUDGET=${GPU_CHECK_DRY_BUDGET:-1800}
MAX_BUDGET=${GPU_CHECK_MAX_BUDGET:-0}
KILL_AFTER=5  # seconds a step gets after its budget's SIGTERM before SIGKILL
# log lines that mean a step's steps did not run as asked (step_graphs.py's warnings, old and new)
FALLBACKS='CAPTURE FALLBACK|COMPILE FALLBACK|CUDA graph capture failed|Inductor could not compile|no captured CUDA graph'

# part, step, budget in seconds (on the GPU). Part 1's budgets plus KILL_AFTER per step stay within 420 s (7
# minutes), part 2's and part 3's within 540 s; tests/core/test_gpu_check_dry.py checks them.
STEPS="
1 environment        10
1 test-cuda          85
1 iteration_cost    130
1 ar                 55
1 speculative        50
1 quantization       60
2 decode_counts      40
2 ar-rest           105
2 same_seed          20
2 batched            75
2 families           90
2 prefix_states      30
2 decode             25
2 quantization-rest 105
3 test-cuda-rest    530
"

case $PART in 1|2|3|all) ;; *) echo "PART must be 1, 2, 3 or all (got '$PART')" >&2; exit 2 ;; esac
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
if [ -n "${RESULTS:-}" ]; then mkdir -p "$RESULTS" && RESULTS=$(cd "$RESULTS" && pwd); fi
cd "$(dirname "$0")/.." || exit 2  # the repository root
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
if [ "$DRY" = 1 ]; then
  DEVICE=cpu RESULTS=${RESULTS:-$WORK/results}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # tiny shapes: threads only contend
else
  DEVICE=cuda RESULTS=${RESULTS:-$PWD/bench/results}
fi
mkdir -p "$RESULTS"
export PY GPU_CHECK_DRY=$DRY

report_environment() {  # the GPU, its driver, torch and CUDA; on a GPU run, fails without CUDA
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
    nvidia-smi
  else
    echo "nvidia-smi: not found"
  fi
  "$PY" - <<'EOF'
import os, platform, sys
from importlib import metadata

import torch

print("python", sys.version.split()[0], platform.machine(), "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability(),
          "memory GiB", round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
for name in ("numpy", "transformers", "safetensors", "pillow", "triton", "scikit-image", "scipy"):
    try:
        print(name, metadata.version(name))
    except metadata.PackageNotFoundError:
        print(name, "not installed")
sys.exit(0 if torch.cuda.is_available() or os.environ.get("GPU_CHECK_DRY") == "1" else 1)
EOF
}
export -f report_environment

LIFECYCLE_TESTS=tests/core/test_graph_lifecycle.py  # part 1: capture sequences and captured = eager tokens
mapfile -t CUDA_TESTS < <(grep -l 'mark\.cuda' tests/core/test_*.py | grep -vxF "$LIFECYCLE_TESTS")  # the rest
[ ${#CUDA_TESTS[@]} -gt 0 ] || CUDA_TESTS=(tests/core)

step_command() {  # CMD: step $1's command, with the GPU's arguments or (dry) tiny ones on the CPU
  local module=$1 gpu tiny
  case $1 in
    environment) CMD=(bash -c report_environment); return ;;
    test-cuda) CMD=("$PY" -m pytest -q -m cuda -rs -p no:cacheprovider "$LIFECYCLE_TESTS"); return ;;
    test-cuda-rest)  # Inductor compiles of whole steps, sync checks, reservations: minutes, so a call of its own
      CMD=("$PY" -m pytest -q -m cuda -rs -p no:cacheprovider "${CUDA_TESTS[@]}"); return ;;
    decode_counts)
      gpu=(--dtype bfloat16 --no-inductor)
      tiny=(--dtype bfloat16 --no-inductor --shapes --only "static_tree naive_extend_57" "sjd_coupled 2-D") ;;
    ar)
      gpu=(--dtype bfloat16 --only GPT-XL --batches 1)
      tiny=(--profile smoke --batches 1) ;;
    ar-rest)
      module=ar
      gpu=(--dtype bfloat16 --skip GPT-XL:1 --tag _rest)
      tiny=(--profile smoke --skip tiny:1 --tag _rest) ;;
    iteration_cost)
      gpu=(--dtype bfloat16 --model GPT-XL --iterations 32 --compile graphs auto)
      tiny=(--model tiny --iterations 2 --compile graphs auto) ;;
    speculative)
      gpu=(--dtype bfloat16 --images 4 --round 4 --only eagle2 static_tree "lantern delta=0.1" "lantern_pp lambda=5"
           "sjd_coupled 2-D" "sjd continuation proactive 4 (SJD-PAC)")
      tiny=(--images 1 --round 1 --only "sjd_coupled 2-D") ;;
    same_seed)  # bf16 and float32 tokens of the lossless trees against AR's, eager and replayed
      gpu=(--dtype bfloat16 float32 --compile off graphs --images 2)
      tiny=(--dtype float32 --images 1 --only static_tree) ;;
    batched)
      gpu=(--dtype bfloat16 --images 8 --round 4 --batches 1 4 --only eagle2 static_tree lantern_pp "sjd_coupled 2-D"
           sjd_2d_relaxed)
      tiny=(--images 1 --round 1 --batches 1 --only "lantern_pp") ;;
    families)
      gpu=(--dtype bfloat16 --images 1 --grid 16 --models chameleon:7b lumina:7b janus:1b emu3:8b)
      tiny=(--images 1 --grid 4 --train-steps 0 --models chameleon:micro lumina:micro janus:micro emu3:micro) ;;
    prefix_states)
      gpu=(--dtype bfloat16 --model GPT-XL --repeats 2)
      tiny=(--model tiny --grid 2 --repeats 1) ;;
    decode)
      gpu=(--dtype bfloat16 --repeats 3)
      tiny=(--batches 1 2 --llamagen-batches 1 --llamagen-grid 4 --repeats 1) ;;
    quantization)
      module=quantization_gpu
      gpu=(--model 7B --batches 1 --compile graphs --matmul fused)
      tiny=(--model tiny --batches 1 --compile graphs --matmul fused) ;;
    quantization-rest)
      module=quantization_gpu
      gpu=(--model 7B --batches 1 4 --compile graphs --matmul fused dequantize --tag _rest)
      tiny=(--model tiny --batches 1 --compile graphs --matmul dequantize --tag _rest) ;;
    *) echo "no command for step $1" >&2; CMD=(false); return ;;
  esac
  if [ "$DRY" = 1 ]; then gpu=("${tiny[@]}"); fi
  CMD=("$PY" -m "lantern_core.benchmarks.$module" --device "$DEVICE" --out "$RESULTS" "${gpu[@]}")
}

start_part() {  # the part's folders, a clean summary line file and the time its reports must be newer than
  local dir=$WORK/part$1
  [ -d "$dir" ] && return
  mkdir -p "$dir/logs" "$dir/results"
  touch "$dir/.start" "$dir/summary.txt"
  rm -f "$OUT/summary_part$1.txt" "$OUT/gpu_check_part$1.tar.gz"
}

pack_part() {  # this part's logs, the reports written since it started and its summary -> one archive in $OUT
  local dir=$WORK/part$1
  find "$RESULTS" -maxdepth 1 -type f -newer "$dir/.start" \
    \( -name "*_${DEVICE}_*.json" -o -name "*_${DEVICE}_*.md" \) -exec cp -p {} "$dir/results/" \;
  cp "$dir/summary.txt" "$OUT/summary_part$1.txt"
  tar -czf "$WORK/part$1.tar.gz" -C "$WORK" --exclude .start "part$1" && \
    mv -f "$WORK/part$1.tar.gz" "$OUT/gpu_check_part$1.tar.gz"
}

run_step() {  # part, step, budget: run the step under its budget, log it, record its line, pack the part
  local part=$1 name=$2 budget=$3 start=$SECONDS rc took status fallbacks note="" log
  if [ "$DRY" = 1 ]; then budget=$DRY_BUDGET; fi  # the CPU is no GPU: its budgets are not the GPU's
  if [ "$MAX_BUDGET" -gt 0 ] && [ "$budget" -gt "$MAX_BUDGET" ]; then budget=$MAX_BUDGET; fi
  start_part "$part"
  step_command "$name"
  echo "== part $part: $name (budget ${budget}s)"
  log=$WORK/part$part/logs/$name.log
  echo "\$ ${CMD[*]}" > "$log"
  timeout -k "$KILL_AFTER" "$budget" "${CMD[@]}" >> "$log" 2>&1 < /dev/null
  rc=$?
  took=$((SECONDS - start))
  fallbacks=$(tail -n +2 "$log" | grep -cE "$FALLBACKS")  # not the command line itself
  if { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && [ $took -ge "$budget" ]; then
    status=timed-out
  elif [ $rc -eq 0 ] && [ "$fallbacks" -eq 0 ]; then
    status=passed
  else
    status=failed
  fi
  if [ "$fallbacks" -gt 0 ]; then note=" ($fallbacks fallbacks)"; fi
  printf 'part %s  %-17s %-9s rc=%-3s %4ss of %4ss%s\n' "$part" "$name" "$status" "$rc" "$took" "$budget" "$note" \
    | tee -a "$WORK/part$part/summary.txt"
  pack_part "$part"
}

while read -r part name budget; do
  [ -n "$part" ] || continue
  case $PART in all|"$part") run_step "$part" "$name" "$budget" ;; esac
done <<< "$STEPS"

# the one-screen summary
lines=$(cat "$WORK"/part*/summary.txt)
count() { grep -c " $1 " <<< "$lines"; }
echo
echo "GPU check$([ "$DRY" = 1 ] && echo " (dry run on the CPU)"), PART=$PART:"
echo "$lines"
echo "passed $(count passed), failed $(count failed), timed out $(count timed-out);" \
  "$(grep -oE '[0-9]+ fallbacks\)' <<< "$lines" | awk '{sum += $1} END {print sum + 0}')" \
  "capture or compile fallbacks;" \
  "$(awk '{sum += $6} END {print sum}' <<< "$lines")s of $(awk '{sum += $8} END {print sum}' <<< "$lines")s budgeted"
ls -1 "$OUT"/gpu_check_part*.tar.gz "$OUT"/summary_part*.txt 2>/dev/null
[ "$(count passed)" -eq "$(wc -l <<< "$lines")" ]
