# Two commands for a fresh machine: `make demo` and `make test`. Everything else is optional.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= outputs/demo

.PHONY: demo test bench bench-cuda train-default clean-venv

$(STAMP): requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

## Generate images with the embedded default model and print stats.
demo: $(STAMP)
	$(PY) -m lantern_core generate --cls astronaut --cls cat --cls rocket --cls coffee --seed 0 --out $(DEMO_OUT)

## The whole test suite (CPU).
test: $(STAMP)
	$(PY) -m pytest -q tests

## AR benchmarks on this CPU -> bench/results/ar_cpu_float32.{json,md}.
bench: $(STAMP)
	$(PY) -m lantern_core.bench --out bench/results

## The GPU variant (< 5 min on one GPU) -> bench/results/ar_cuda_bfloat16.{json,md}.
bench-cuda: $(STAMP)
	$(PY) -m lantern_core.bench --device cuda --dtype bfloat16 --out bench/results

## Re-train the embedded default model (~25 min on 2 CPU cores; deterministic).
train-default: $(STAMP)
	$(PY) -m lantern_core.train_embedded --out lantern_core/assets/default --seed 0

clean-venv:
	rm -rf $(VENV)
