"""Batched decoding benchmark on the embedded model (`make bench`, `make bench-cuda`): images per second at
batch 1, 4 and 8 for every decoding mode next to plain AR at the same batch, with the quality columns of
the speculative benchmark (classifier accuracy, Frechet distance on classifier features against real crops,
token-marginal TVD against AR at the same batch; `ar (other seeds)` is the noise floor).

One interleaved run: images are processed in rounds of 8; within a round every batch size and every method
decodes the same 8 images (class i mod 8, seed i) before the next round starts, so machine noise spreads
over every row alike. `auto` trees and windows are calibrated per batch size before the timed rounds.
Timings are never asserted anywhere; the goals are checked in the report.

    python -m lantern_core.benchmarks.batched --out bench/results               # 32 images per row
    python -m lantern_core.benchmarks.batched --images 8 --out /tmp/b            # quick look
    python -m lantern_core.benchmarks.batched --images 4 --round 4 --batches 1 4 --only sjd_coupled  # a subset
"""
from __future__ import annotations

import argparse
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..conditioning import Condition
from ..config import SamplingConfig
from ..decoding.generate import synchronize
from ..decoding.jacobi.config import JacobiConfig
from ..decoding.acceptance.neighbors import build_neighbors
from ..decoding.acceptance.relaxation import Relaxation
from ..decoding.sampling import make_generators
from ..decoding.trees.config import SpeculativeConfig
from ..decoding.trees.specs import NAIVE_EXTEND_57
from ..loading.embedded import EMBEDDED_NAME, load_embedded
from .ar import machine_info
from .report_writer import Report, step_cells
from .speculative import CPU_DYNAMIC, Method, Tally, quality_cells, summarise, timing_rows, tree_label

log = logging.getLogger("lantern_core.benchmarks.batched")
BATCHES = (1, 4, 8)
ROUND = 8  # images per interleaving round (a multiple of every batch size)
EXACT = ("eagle2", "static_tree (auto)", "sjd", "sjd_coupled", "sjd_coupled 2-D (next row)")
RELAXED = ("lantern delta=0.2", "lantern_pp lambda=5", "sjd_relaxed lambda=5", "sjd_2d_relaxed")


def methods(device: torch.device) -> list[Method]:
    """AR, its noise floor and one row per decoding mode the nodes offer (LANTERN at its benchmark setting).
    EAGLE-2 keeps its published 58-node shape on a GPU and a CPU-sized one elsewhere."""
    dynamic = SpeculativeConfig(tree="dynamic") if device.type == "cuda" else SpeculativeConfig(tree="dynamic",
                                                                                                 dynamic=CPU_DYNAMIC)
    coupled = dict(coupled=True, init="sample_left")
    return [Method("ar", None), Method("ar (other seeds)", None, seed_offset=100_000),
            Method("eagle2", dynamic),
            Method("static_tree (auto)", SpeculativeConfig(tree="auto", static_tree=NAIVE_EXTEND_57)),
            Method("lantern delta=0.2", SpeculativeConfig(tree=dynamic.tree, dynamic=dynamic.dynamic,
                                                          relaxation=Relaxation(k=1000, delta=0.2))),
            Method("lantern_pp lambda=5", SpeculativeConfig(tree="auto", static_tree=NAIVE_EXTEND_57,
                                                            relaxation=Relaxation(k=10, lam=5.0))),
            Method("sjd", JacobiConfig("auto", init="sample_left")),
            Method("sjd_coupled", JacobiConfig("auto", **coupled)),
            Method("sjd_coupled 2-D (next row)", JacobiConfig("auto", **coupled, rows=2, row_window=16, row_offset=-1)),
            Method("sjd_relaxed lambda=5", JacobiConfig("auto", **coupled, relaxation=Relaxation(k=10, lam=5.0))),
            Method("sjd_2d_relaxed", JacobiConfig("auto", **coupled, rows=6, row_window=6, row_commit=True,
                                                  row_lead=0))]


@torch.no_grad()
def run(images: int, sampling: SamplingConfig, device: torch.device, dtype: torch.dtype,
        batches: tuple[int, ...] = BATCHES, only: tuple[str, ...] = (), round_size: int = ROUND,
        report: Report | None = None) -> dict:
    """Decode `images` per (batch, method) in interleaved rounds of `round_size` images (the methods whose names
    start with one of `only`, all when empty; the AR rows always); `report` gets the timing columns after every
    round, then the quality columns and the goals. Returns the report's data."""
    report = report or Report(None, "batched", markdown)
    pipe = load_embedded(device, dtype, drafter=True)
    model, drafter, vq = pipe.gpt.model, pipe.drafter.model, pipe.vq.model
    neighbors = build_neighbors(vq.quantize.embedding.weight, 1000)
    rows = [m for m in methods(device) if m.name.startswith("ar") or not only or m.name.startswith(only)]
    tallies = {(b, m.name): Tally() for b in batches for m in rows}
    for b in batches:  # warm-up (and `auto` calibration at this batch size) outside the timed rounds
        for m in rows:
            m.decode(model, drafter, Condition.classes(list(range(b)), device=device), sampling,
                     make_generators(999_999, b, device), neighbors)
    for start in range(0, images, round_size):
        for b in batches:
            for m in rows:
                t = tallies[(b, m.name)]
                for first in range(start, start + round_size, b):
                    idx = list(range(first, first + b))
                    labels = [i % 8 for i in idx]
                    cond = Condition.classes(labels, device=device)
                    gens = make_generators(first + m.seed_offset, b, device)
                    synchronize(device)
                    t0 = time.perf_counter()
                    result = m.decode(model, drafter, cond, sampling, gens, neighbors)
                    synchronize(device)
                    t.seconds += time.perf_counter() - t0
                    t.steps = t.steps.merged(result.stats.steps)
                    # per image: the prefill and its verifications (AR: one forward per token)
                    t.forwards += result.stats.forward_passes * (1 if m.spec is not None else b)
                    if m.spec is not None:
                        t.trees.add(tree_label(result.stats.tree))
                    t.images += b
                    t.tokens.append(result.tokens.cpu())
                    t.labels.extend(labels)
        log.info("round %d/%d done", start // round_size + 1, -(-images // round_size))
        report.update(rows=[r | {"batch": b, "images_per_s": 1.0 / r["s_per_image"]} for b in batches
                            for r in timing_rows(rows, {m.name: tallies[(b, m.name)] for m in rows})])
    out = []
    for b in batches:
        summary = summarise(rows, {m.name: tallies[(b, m.name)] for m in rows}, vq, device, images,
                            model.config.vocab_size)
        for r in summary["rows"]:
            out.append(r | {"batch": b, "images_per_s": 1.0 / r["s_per_image"]})
    return report.update(rows=out, goals=goals(out, device))


def goals(rows: list[dict], device: torch.device) -> list[dict]:
    """The batched goals at batch 4, each with the measured ratio to AR at batch 4 and whether it is met."""
    at4 = {r["method"]: r["speedup_vs_ar"] for r in rows if r["batch"] == 4}
    if not at4:
        return []
    if device.type == "cuda":
        wanted = [(name, 1.0) for name in EXACT] + [(name, 2.0) for name in RELAXED]
    else:
        wanted = [("sjd_coupled", 1.0), ("sjd_relaxed lambda=5", 1.0), ("sjd_coupled 2-D (next row)", 1.0),
                  ("sjd_2d_relaxed", 1.0)]
    measured = {name: round(ratio, 3) for name, ratio in at4.items()}  # the verdict is the reported figure's
    return [{"method": name, "goal": f"> {need:g}x AR at batch 4" if need == 1.0 else f">= {need:g}x AR at batch 4",
             "measured": measured[name], "met": measured[name] > need if need == 1.0 else measured[name] >= need}
            for name, need in wanted if name in measured]


def markdown(report: dict) -> str:
    s = report["sampling"]
    lines = [f"# Batched decoding on the embedded model ({report['device']}, {report['dtype']})", "",
             f"{report['model']}; {report['machine']}; torch {report['torch']}, {report['threads']} threads; "
             f"cfg {s['cfg_scale']}, temperature {s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}; "
             f"{report['images']} images per row (class i mod 8, seed i), batch sizes and methods interleaved per "
             f"round of {report.get('round', ROUND)} images; {report['date']}", "",
             "| batch | method | tree / window | images / s | speed-up vs AR at this batch | mean accepted length | "
             "classifier acc. | Frechet (clf features) vs real | token-marginal TVD vs AR | graphs | compiled |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report.get("rows", []):
        lines.append(f"| {r['batch']} | {r['method']} | {r['tree']} | {r['images_per_s']:.2f} | "
                     f"{r['speedup_vs_ar']:.2f}x | {r['mean_accepted_length']:.2f} | {quality_cells(r)} | "
                     f"{step_cells(r)} |")
    lines += ["", "Mean accepted length: image tokens per target forward per image (prefill included). The batch "
                  "runs until its slowest image is done: where steps run eagerly (CPU, MPS) an image that is done "
                  "leaves the batch and stops costing work; a captured (CUDA) batch keeps it, masked, at no extra "
                  "forward. `graphs` / `compiled`: how the timed runs' steps ran (as in the speculative report).",
              "", "## Goals", "", "| method | goal | measured | met |", "|---|---|---|---|"]
    for g in report.get("goals", []):
        lines.append(f"| {g['method']} | {g['goal']} | {g['measured']:.2f}x | {'yes' if g['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description="batched decoding benchmark (embedded model)")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--images", type=int, default=32, help="images per row (a multiple of --round)")
    parser.add_argument("--round", type=int, default=ROUND, help="images per interleaving round")
    parser.add_argument("--batches", type=int, nargs="*", default=list(BATCHES))
    parser.add_argument("--cfg", type=float, default=3.0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--only", nargs="*", default=[], help="method-name prefixes to run (the AR rows always run)")
    args = parser.parse_args(argv)
    if args.images % args.round or any(args.round % b for b in args.batches):
        parser.error(f"--images must be a multiple of --round ({args.round}) and every batch size must divide it")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    sampling = SamplingConfig(cfg_scale=args.cfg, temperature=args.temperature)
    report = Report(args.out, f"batched_{device.type}_{args.dtype}", markdown, **machine_info(device),
                    model=EMBEDDED_NAME, dtype=args.dtype, images=args.images, round=args.round,
                    sampling=asdict(sampling), rows=[])
    torch.set_flush_denormal(True)
    try:
        run(args.images, sampling, device, dtype, tuple(args.batches), tuple(args.only), args.round, report)
    finally:
        torch.set_flush_denormal(False)
    return report.finish()


if __name__ == "__main__":
    main()
