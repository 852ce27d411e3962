"""int8 / fp8 weights on a GPU (`make bench-cuda`, `bench/gpu_check.sh`): ms per AR step and peak memory of a
random 7B LlamaGen-shaped target (dim 4096, 32 layers, 24 x 24 grid) in bf16, int8 and fp8, at batch 1 and 4
(cfg 4: twice the rows), each under the step runners `--compile` names ("graphs": CUDA graphs of the eager
step, two extra kernels per quantized linear; "auto": the step fused by Inductor first, where the int8/fp8
convert fuses into the GEMM).

Formats run one after another, each from a fresh model (weights made in float32 on the device, then cast and
quantized), so one model is resident at a time; the peak is `torch.cuda.max_memory_allocated` over the timed
run, with the resident weights beside it. The CPU runs it too (`--model GPT-B` for a quick look; no peak).

    python -m lantern_core.benchmarks.quantization_gpu --device cuda --out bench/results
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import SamplingConfig, gpt_preset
from ..decoding.generate import generate, synchronize
from ..decoding.sampling import make_generators
from ..decoding.step_graphs import COMPILE_CHOICES
from ..models.quantized import WEIGHT_CHOICES, quantize_blocks, resident_bytes, scheme_named
from .ar import SEVEN_B, machine_info, random_model, write_report

log = logging.getLogger("lantern_core.benchmarks.quantization_gpu")
MODELS = {"7B": SEVEN_B, "GPT-B": gpt_preset("GPT-B", "c2i", 256)}


def build(config, device: torch.device, weights: str) -> torch.nn.Module:
    model = random_model(config, device, torch.bfloat16)
    with torch.no_grad():
        model.output.weight.normal_(0.0, config.dim ** -0.5)  # LlamaGen's init zeroes the head: uniform laws
    return quantize_blocks(model, scheme_named(weights))


def time_run(model, batch: int, compile: str, device: torch.device, sampling: SamplingConfig) -> tuple[float, int]:
    """(ms per AR step, peak bytes allocated) of one whole image batch, after a warm-up run (captures)."""
    condition = Condition.classes([i % model.config.num_classes for i in range(batch)], device=device)
    generate(model, condition, sampling, make_generators(1, batch, device), compile=compile)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    result = generate(model, condition, sampling, make_generators(0, batch, device), compile=compile)
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return 1000.0 * seconds / result.stats.forward_passes, peak


def run(config, device: torch.device, batches: tuple[int, ...], compiles: tuple[str, ...]) -> list[dict]:
    sampling = SamplingConfig(cfg_scale=4.0, temperature=1.0)
    rows = []
    for weights in WEIGHT_CHOICES:
        model = build(config, device, weights)
        resident = resident_bytes(model)
        for compile in compiles:
            for batch in batches:
                ms, peak = time_run(model, batch, compile, device, sampling)
                rows.append({"weights": weights, "compile": compile, "batch": batch, "ms_per_step": ms,
                             "resident_weight_bytes": resident, "peak_allocated_bytes": peak})
                log.info("%s", rows[-1])
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def markdown(report: dict) -> str:
    lines = [f"# int8 / fp8 weights: AR step time and memory ({report['device']}, bfloat16 compute)", "",
             f"{report['model']}; {report['machine']}; torch {report['torch']}; cfg 4; {report['date']}", "",
             "| weights | compile | batch | ms / step | vs bf16 | resident weights (GiB) | peak allocated (GiB) |",
             "|---|---|---|---|---|---|---|"]
    base = {(r["compile"], r["batch"]): r["ms_per_step"] for r in report["rows"] if r["weights"] == "none"}
    for r in report["rows"]:
        lines.append(f"| {r['weights']} | {r['compile']} | {r['batch']} | {r['ms_per_step']:.2f} | "
                     f"{r['ms_per_step'] / base[(r['compile'], r['batch'])]:.2f}x | "
                     f"{r['resident_weight_bytes'] / 2**30:.2f} | {r['peak_allocated_bytes'] / 2**30:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="int8 / fp8 weights: step time and memory")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="7B", choices=sorted(MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--compile", nargs="+", default=["graphs"], choices=COMPILE_CHOICES,
                        help="graphs: the eager step captured; auto: fused by Inductor first (minutes for 7B)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device(args.device)
    report = {**machine_info(device), "model": f"{args.model} (random weights)",
              "rows": run(MODELS[args.model], device, tuple(args.batches), tuple(args.compile))}
    write_report(args.out, f"quantization_{device.type}_bfloat16", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
