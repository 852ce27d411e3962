"""int8 / fp8 weights on a GPU (`make bench-cuda`, `bench/gpu_check.sh`): ms per AR step and peak memory of a
random 7B LlamaGen-shaped target (dim 4096, 32 layers, 24 x 24 grid) in bf16, int8 and fp8, at batch 1 and 4
(cfg 4: twice the rows), each under the step runners `--compile` names ("graphs": CUDA graphs of the eager
step; "auto": the step fused by Inductor first). `--matmul` picks the int8/fp8 matmul: "fused" (the default:
each stored byte read once, docs/quantized_matmul.md) and/or "dequantize" (`FUSED_ROWS = 0`: the weight
dequantized at every call, the control).

Formats run one after another, each from a fresh model (weights made in float32 on the device, then cast and
quantized), so one model is resident at a time; the peak is `torch.cuda.max_memory_allocated` over the timed
run, with the resident weights beside it. The CPU runs it too (`--model GPT-B` for a quick look, `--model tiny`
for the code paths; no peak). The report is rewritten after every row.

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
from ..decoding.step_graphs import COMPILE_CHOICES, StepExecution
from ..models import quantized
from ..models.quantized import WEIGHT_CHOICES, quantize_blocks, resident_bytes, scheme_named
from .ar import SEVEN_B, TINY_SHAPE, file_tag, machine_info, random_model
from .report_writer import Report, step_cells, step_fields

log = logging.getLogger("lantern_core.benchmarks.quantization_gpu")
MODELS = {"7B": SEVEN_B, "GPT-B": gpt_preset("GPT-B", "c2i", 256), "tiny": TINY_SHAPE}


def build(config, device: torch.device, weights: str) -> torch.nn.Module:
    model = random_model(config, device, torch.bfloat16)
    with torch.no_grad():
        model.output.weight.normal_(0.0, config.dim ** -0.5)  # LlamaGen's init zeroes the head: uniform laws
    return quantize_blocks(model, scheme_named(weights))


def time_run(model, batch: int, compile: str, device: torch.device,
             sampling: SamplingConfig) -> tuple[float, int, StepExecution]:
    """(ms per AR step, peak bytes allocated, how its steps ran) of one whole image batch, after a warm-up run
    (captures)."""
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
    return 1000.0 * seconds / result.stats.forward_passes, peak, result.stats.steps


def run(config, device: torch.device, batches: tuple[int, ...], compiles: tuple[str, ...],
        matmuls: tuple[str, ...] = ("fused",), report: Report | None = None) -> list[dict]:
    """One row per format, matmul, step runner and batch, each added to `report` (rewritten) as it is measured."""
    report = report or Report(None, "quantization", markdown)
    sampling = SamplingConfig(cfg_scale=4.0, temperature=1.0)
    rows, fused_rows = report.data.setdefault("rows", []), quantized.FUSED_ROWS
    for weights, matmul in [(w, m) for w in WEIGHT_CHOICES for m in (("-",) if w == "none" else matmuls)]:
        quantized.FUSED_ROWS = 0 if matmul == "dequantize" else fused_rows
        model = build(config, device, weights)
        resident = resident_bytes(model)
        for compile in compiles:
            for batch in batches:
                ms, peak, steps = time_run(model, batch, compile, device, sampling)
                report.add("rows", {"weights": weights, "matmul": matmul, "compile": compile, "batch": batch,
                                    "ms_per_step": ms, "resident_weight_bytes": resident,
                                    "peak_allocated_bytes": peak, **step_fields(steps)})
                log.info("%s", rows[-1])
        quantized.FUSED_ROWS = fused_rows
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def markdown(report: dict) -> str:
    lines = [f"# int8 / fp8 weights: AR step time and memory ({report['device']}, bfloat16 compute)", "",
             f"{report['model']}; {report['machine']}; torch {report['torch']}; cfg 4; {report['date']}", "",
             "| weights | compile | batch | ms / step | vs bf16 | resident weights (GiB) | peak allocated (GiB) | "
             "graphs | compiled |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = {(r["compile"], r["batch"]): r["ms_per_step"] for r in report["rows"] if r["weights"] == "none"}
    for r in report["rows"]:
        weights = r["weights"] if r.get("matmul", "-") in ("-", "fused") else f"{r['weights']} ({r['matmul']})"
        bf16 = base.get((r["compile"], r["batch"]))  # absent while a stopped run's bf16 row is missing
        ratio = f"{r['ms_per_step'] / bf16:.2f}x" if bf16 else ""
        lines.append(f"| {weights} | {r['compile']} | {r['batch']} | {r['ms_per_step']:.2f} | {ratio} | "
                     f"{r['resident_weight_bytes'] / 2**30:.2f} | {r['peak_allocated_bytes'] / 2**30:.2f} | "
                     f"{step_cells(r)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="int8 / fp8 weights: step time and memory")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="7B", choices=sorted(MODELS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--compile", nargs="+", default=["graphs", "auto"], choices=COMPILE_CHOICES,
                        help="graphs: the eager step captured; auto: fused by Inductor first (minutes for 7B)")
    parser.add_argument("--matmul", nargs="+", default=["fused"], choices=["fused", "dequantize"],
                        help="int8/fp8 matmul: fused (each stored byte read once) and/or dequantize (the control)")
    parser.add_argument("--tag", default="",
                        help="a file-name part for a subset run (e.g. _rest: quantization_rest_cuda_bfloat16)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    device = torch.device(args.device)
    report = Report(args.out, f"quantization{file_tag(args.tag)}_{device.type}_bfloat16", markdown,
                    **machine_info(device), model=f"{args.model} (random weights)", rows=[])
    run(MODELS[args.model], device, tuple(args.batches), tuple(args.compile), tuple(args.matmul), report)
    return report.finish()


if __name__ == "__main__":
    main()
