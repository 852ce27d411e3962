"""What a decoding run allocates against what the sampler reserves for it (`make bench`).

For AR and every mode of `decode_counts` (sampled settings), at batch 1 and 4 on the embedded model (cfg 3,
so twice the rows): the peak of live bytes the run allocates (`memory_track.track_allocations`: every op's
new storage while a tensor holds it; weights are not counted, they are placed before the run) next to
`decoding/generate.py::estimate_run_bytes`, the figure the sampler node passes to ComfyUI's model management
as the run's memory. A ratio above 1 is memory the host was not told about.

    python -m lantern_core.benchmarks.run_memory --out bench/results
    python -m lantern_core.benchmarks.run_memory --batches 1 --only sjd --out /tmp/m      # quick look
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import SamplingConfig
from ..decoding.generate import estimate_run_bytes, generate
from ..decoding.jacobi import JacobiConfig, jacobi_generate
from ..decoding.neighbors import build_neighbors
from ..decoding.sampling import make_generators
from ..decoding.speculative import speculative_generate
from ..loading.embedded import EMBEDDED_NAME, load_embedded
from .ar import machine_info, write_report
from .decode_counts import jacobi_modes, tree_modes
from .memory_track import track_allocations

log = logging.getLogger("lantern_core.benchmarks.run_memory")


def modes(k: int) -> list[tuple[str, object]]:
    """(name, None for AR | SpeculativeConfig | JacobiConfig) for every sampled mode."""
    return [("ar", None), *((n, s) for n, s, greedy in tree_modes(k) + jacobi_modes(k) if not greedy)]


def measure(pipe, neighbors, spec, batch: int, sampling: SamplingConfig) -> int:
    """Peak bytes allocated by one run of `spec` for `batch` images (eager: what a step allocates)."""
    model, drafter = pipe.gpt.model, pipe.drafter.model
    condition = Condition.classes([i % 8 for i in range(batch)])
    generators = make_generators(0, batch)
    with torch.no_grad(), track_allocations() as tally:
        if spec is None:
            generate(model, condition, sampling, generators, compile="off")
        elif isinstance(spec, JacobiConfig):
            jacobi_generate(model, condition, sampling, spec, generators, neighbors, compile="off")
        else:
            speculative_generate(model, drafter, condition, sampling, spec, generators, neighbors, compile="off")
    return tally.peak


def run(batches: tuple[int, ...], only: str, sampling: SamplingConfig) -> list[dict]:
    pipe = load_embedded("cpu", torch.float32, drafter=True)
    neighbors = build_neighbors(pipe.vq.model.quantize.embedding.weight, 10)
    rows = []
    for name, spec in modes(10):
        if only and not name.startswith(only):
            continue
        for batch in batches:
            start = time.perf_counter()
            peak = measure(pipe, neighbors, spec, batch, sampling)
            estimate = estimate_run_bytes(pipe.gpt.config, batch, sampling.uses_cfg, torch.float32)
            rows.append({"mode": name, "batch": batch, "measured_peak_bytes": peak, "estimate_bytes": estimate,
                         "measured_over_estimate": peak / estimate})
            log.info("%s batch %d: %.2f MiB measured, %.2f MiB estimated (%.1f s)", name, batch, peak / 2**20,
                     estimate / 2**20, time.perf_counter() - start)
    return rows


def markdown(report: dict) -> str:
    lines = [f"# Run memory: allocated vs reserved ({report['device']}, float32)", "",
             f"{report['model']}; {report['machine']}; torch {report['torch']}; cfg {report['cfg']}; {report['date']}",
             "", "| mode | batch | measured peak (MiB) | reserved by the sampler (MiB) | measured / reserved |",
             "|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['mode']} | {r['batch']} | {r['measured_peak_bytes'] / 2**20:.2f} | "
                     f"{r['estimate_bytes'] / 2**20:.2f} | {r['measured_over_estimate']:.2f} |")
    lines += ["", "Measured: peak of live bytes of every storage the run's ops allocate (eager, the CPU; weights "
              "excluded). Reserved: `estimate_run_bytes` (the target's KV cache at max_seq_len slots, prefill "
              "activations, one row of logits), what the sampler node tells ComfyUI's model management. Above 1: "
              "the drafter's cache, tree and window spare slots, noise tables and verification activations the "
              "reservation does not count yet (issue 30 item 4)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="run memory: allocated vs reserved (embedded model, CPU)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--only", default="", help="modes whose name starts with this")
    parser.add_argument("--cfg", type=float, default=3.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sampling = SamplingConfig(cfg_scale=args.cfg, temperature=1.0)
    report = {**machine_info(torch.device("cpu")), "model": EMBEDDED_NAME, "cfg": args.cfg,
              "rows": run(tuple(args.batches), args.only, sampling)}
    write_report(args.out, "run_memory_cpu", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
